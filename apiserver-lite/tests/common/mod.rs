//! Helpers shared by the in-process tests.

/// `k8s\0` + runtime.Unknown{typeMeta{apiVersion, kind}, raw}: a body as client-go's protobuf
/// codec writes it.
pub fn protobuf_envelope(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
    fn field(out: &mut Vec<u8>, tag: u8, bytes: &[u8]) {
        out.push(tag);
        let mut len = bytes.len();
        loop {
            let byte = (len & 0x7f) as u8;
            len >>= 7;
            if len == 0 {
                out.push(byte);
                break;
            }
            out.push(byte | 0x80);
        }
        out.extend_from_slice(bytes);
    }
    let mut tm = Vec::new();
    field(&mut tm, 0x0a, api_version.as_bytes());
    field(&mut tm, 0x12, kind.as_bytes());
    let mut out = b"k8s\0".to_vec();
    field(&mut out, 0x0a, &tm);
    field(&mut out, 0x12, raw);
    out
}

//! Reading what was appended to a file since last time: how `kubectl logs -f` and the attach
//! fallback (a container without a console) follow a container's log as it grows.

use std::path::Path;

use tokio::io::{AsyncReadExt, AsyncSeekExt};

/// The bytes of `path` past `offset` (which moves past them); None when there are none yet or
/// the file cannot be read (it may not exist yet: a retry later sees it).
pub async fn appended(path: &Path, offset: &mut u64) -> Option<Vec<u8>> {
    let mut f = tokio::fs::File::open(path).await.ok()?;
    let len = f.metadata().await.map(|m| m.len()).unwrap_or(*offset);
    if len <= *offset {
        return None;
    }
    f.seek(std::io::SeekFrom::Start(*offset)).await.ok()?;
    let mut chunk = Vec::new();
    (&mut f).take(len - *offset).read_to_end(&mut chunk).await.ok()?;
    *offset += chunk.len() as u64;
    Some(chunk)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn only_what_came_since() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.log");
        let mut offset = 0;
        assert_eq!(appended(&path, &mut offset).await, None, "no file yet");
        std::fs::write(&path, b"one\n").unwrap();
        assert_eq!(appended(&path, &mut offset).await.as_deref(), Some(&b"one\n"[..]));
        assert_eq!(appended(&path, &mut offset).await, None, "nothing new");
        use std::io::Write;
        std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(b"two\n").unwrap();
        assert_eq!(appended(&path, &mut offset).await.as_deref(), Some(&b"two\n"[..]));
        assert_eq!(offset, 8);
    }
}

//! Container logs in the CRI format that container runtimes write and kubelet reads: one record
//! per line, `TIME STREAM TAG CONTENT`, where TIME is RFC 3339 UTC with nanoseconds, STREAM is
//! `stdout` or `stderr`, and TAG is `F` for a whole line (its newline is not stored) or `P` for
//! a piece of a longer one. The container's monitor writes them ([`Encoder`]); the kubelet API
//! renders them for `pods/log` as kubelet does ([`Render`]: `tailLines`, `sinceTime`,
//! `timestamps`, `limitBytes`). All pure.

use jiff::Timestamp;

/// A line longer than this is cut into `P` records (containerd's limit).
pub const MAX_LINE: usize = 16 << 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    fn name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// Cuts one stream's output into records. An unfinished line waits for its newline, for
/// [`MAX_LINE`] bytes, or for the end of the stream.
#[derive(Debug)]
pub struct Encoder {
    stream: Stream,
    pending: Vec<u8>,
}

fn record(out: &mut Vec<u8>, now: Timestamp, stream: Stream, partial: bool, content: &[u8]) {
    out.extend_from_slice(format!("{now:.9} {} {} ", stream.name(), if partial { 'P' } else { 'F' }).as_bytes());
    out.extend_from_slice(content);
    out.push(b'\n');
}

impl Encoder {
    pub fn new(stream: Stream) -> Encoder {
        Encoder { stream, pending: Vec::new() }
    }

    /// Appends the records `data` completes to `out`.
    pub fn push(&mut self, now: Timestamp, data: &[u8], out: &mut Vec<u8>) {
        let mut rest = data;
        while !rest.is_empty() {
            match rest.iter().position(|b| *b == b'\n') {
                Some(i) if self.pending.len() + i <= MAX_LINE => {
                    self.pending.extend_from_slice(&rest[..i]);
                    record(out, now, self.stream, false, &self.pending);
                    self.pending.clear();
                    rest = &rest[i + 1..];
                }
                _ => {
                    let room = MAX_LINE - self.pending.len();
                    let take = rest.len().min(room);
                    self.pending.extend_from_slice(&rest[..take]);
                    rest = &rest[take..];
                    if self.pending.len() == MAX_LINE {
                        record(out, now, self.stream, true, &self.pending);
                        self.pending.clear();
                    }
                }
            }
        }
    }

    /// The end of the stream: an unfinished last line is written as a whole one, as containerd
    /// does.
    pub fn finish(&mut self, now: Timestamp, out: &mut Vec<u8>) {
        if !self.pending.is_empty() {
            record(out, now, self.stream, false, &self.pending);
            self.pending.clear();
        }
    }
}

/// One record of a log file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record<'a> {
    pub time: Timestamp,
    pub stream: Stream,
    pub partial: bool,
    pub content: &'a [u8],
}

impl Record<'_> {
    /// What the container wrote: the content, and the newline of a whole line.
    pub fn output(&self) -> Vec<u8> {
        let mut v = self.content.to_vec();
        if !self.partial {
            v.push(b'\n');
        }
        v
    }
}

/// Parses one line of a log file (without its newline); `None` when it is not a record.
pub fn parse(line: &[u8]) -> Option<Record<'_>> {
    let mut parts = line.splitn(4, |b| *b == b' ');
    let time = std::str::from_utf8(parts.next()?).ok()?.parse::<Timestamp>().ok()?;
    let stream = match parts.next()? {
        b"stdout" => Stream::Stdout,
        b"stderr" => Stream::Stderr,
        _ => return None,
    };
    let partial = match parts.next()? {
        b"P" => true,
        b"F" => false,
        _ => return None,
    };
    Some(Record { time, stream, partial, content: parts.next().unwrap_or(b"") })
}

/// Where the last `n` lines of a log file start (the whole file when it has fewer).
pub fn tail_start(log: &[u8], n: usize) -> usize {
    if n == 0 {
        return log.len();
    }
    let body = log.strip_suffix(b"\n").unwrap_or(log);
    let mut seen = 0;
    for (i, b) in body.iter().enumerate().rev() {
        if *b == b'\n' {
            seen += 1;
            if seen == n {
                return i + 1;
            }
        }
    }
    0
}

/// Joins a log file read in pieces into whole lines.
#[derive(Debug, Default)]
pub struct Lines {
    rest: Vec<u8>,
}

impl Lines {
    /// The lines `data` completes (without their newlines), after what earlier calls left
    /// unfinished.
    pub fn feed(&mut self, data: &[u8]) -> Vec<Vec<u8>> {
        self.rest.extend_from_slice(data);
        let Some(end) = self.rest.iter().rposition(|b| *b == b'\n') else { return Vec::new() };
        let lines: Vec<u8> = self.rest.drain(..=end).collect();
        lines[..lines.len() - 1].split(|b| *b == b'\n').map(<[u8]>::to_vec).collect()
    }
}

/// Renders records for a log request, as kubelet does: records older than `since` are left
/// out, `timestamps` puts each record's time (RFC 3339, nanoseconds without trailing zeros)
/// in front, and no more than `limit` bytes go out in all. Fed the file in pieces (`follow`).
#[derive(Debug, Default)]
pub struct Render {
    pub since: Option<Timestamp>,
    pub timestamps: bool,
    /// Bytes still allowed out; `None`: no limit.
    pub limit: Option<usize>,
    lines: Lines,
}

impl Render {
    pub fn new(since: Option<Timestamp>, timestamps: bool, limit: Option<usize>) -> Render {
        Render { since, timestamps, limit, lines: Lines::default() }
    }

    /// The output for the complete lines of `data` (after what earlier calls left unfinished).
    pub fn feed(&mut self, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        for line in self.lines.feed(data) {
            if self.limit == Some(0) {
                break;
            }
            // Lines that are not records (a damaged file) are skipped, as kubelet skips them.
            let Some(r) = parse(&line) else { continue };
            if self.since.is_some_and(|s| r.time < s) {
                continue;
            }
            let mut piece = Vec::new();
            if self.timestamps {
                piece.extend_from_slice(format!("{} ", r.time).as_bytes());
            }
            piece.extend_from_slice(&r.output());
            if let Some(left) = self.limit.as_mut() {
                piece.truncate(*left);
                *left -= piece.len();
            }
            out.extend_from_slice(&piece);
        }
        out
    }

    /// No more bytes may go out.
    pub fn exhausted(&self) -> bool {
        self.limit == Some(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn lines_become_records_with_nanosecond_times() {
        let now = t("2026-11-25T10:00:00.5Z");
        let mut e = Encoder::new(Stream::Stdout);
        let mut out = Vec::new();
        e.push(now, b"hello\nwor", &mut out);
        assert_eq!(out, b"2026-11-25T10:00:00.500000000Z stdout F hello\n");
        out.clear();
        e.push(now, b"ld\n\n", &mut out);
        assert_eq!(
            String::from_utf8(out.clone()).unwrap(),
            "2026-11-25T10:00:00.500000000Z stdout F world\n2026-11-25T10:00:00.500000000Z stdout F \n"
        );
        out.clear();
        let mut e = Encoder::new(Stream::Stderr);
        e.push(now, b"no newline", &mut out);
        assert!(out.is_empty());
        e.finish(now, &mut out);
        assert_eq!(out, b"2026-11-25T10:00:00.500000000Z stderr F no newline\n");
    }

    #[test]
    fn long_lines_are_cut_into_partial_records() {
        let now = t("2026-11-25T10:00:00Z");
        let mut e = Encoder::new(Stream::Stdout);
        let mut out = Vec::new();
        let line = vec![b'x'; MAX_LINE * 2 + 3];
        e.push(now, &line, &mut out);
        e.push(now, b"\n", &mut out);
        let text = String::from_utf8(out).unwrap();
        let tags: Vec<&str> = text.lines().map(|l| l.split(' ').nth(2).unwrap()).collect();
        assert_eq!(tags, ["P", "P", "F"]);
        let mut r = Render::default();
        assert_eq!(r.feed(text.as_bytes()), [line, b"\n".to_vec()].concat(), "the pieces join up again");
    }

    #[test]
    fn records_parse_and_odd_lines_do_not() {
        let r = parse(b"2026-11-25T10:00:00.000000001Z stderr P a b ").unwrap();
        assert_eq!((r.stream, r.partial, r.content), (Stream::Stderr, true, &b"a b "[..]));
        assert_eq!(r.output(), b"a b ");
        assert_eq!(parse(b"2026-11-25T10:00:00Z stdout F").unwrap().content, b"");
        assert!(parse(b"plain text").is_none());
        assert!(parse(b"2026-11-25T10:00:00Z stdin F x").is_none());
        assert!(parse(b"2026-11-25T10:00:00Z stdout X x").is_none());
    }

    fn file() -> Vec<u8> {
        let mut out = Vec::new();
        for (i, s) in ["2026-11-25T10:00:01.1Z", "2026-11-25T10:00:02Z", "2026-11-25T10:00:03.25Z"].iter().enumerate() {
            Encoder::new(Stream::Stdout).push(t(s), format!("line {i}\n").as_bytes(), &mut out);
        }
        out
    }

    #[test]
    fn rendering_as_kubelet_does() {
        let log = file();
        assert_eq!(Render::default().feed(&log), b"line 0\nline 1\nline 2\n");
        assert_eq!(Render::default().feed(&log[tail_start(&log, 2)..]), b"line 1\nline 2\n");
        assert_eq!(tail_start(&log, 0), log.len());
        assert_eq!(tail_start(&log, 10), 0);
        let mut since = Render::new(Some(t("2026-11-25T10:00:02Z")), true, None);
        assert_eq!(
            String::from_utf8(since.feed(&log)).unwrap(),
            "2026-11-25T10:00:02Z line 1\n2026-11-25T10:00:03.25Z line 2\n"
        );
        let mut limited = Render::new(None, false, Some(9));
        assert_eq!(limited.feed(&log), b"line 0\nli");
        assert!(limited.exhausted());
        assert_eq!(limited.feed(&log), b"");
    }

    #[test]
    fn pieces_of_a_file_render_as_the_whole() {
        let log = file();
        let mut r = Render::default();
        let mut out = r.feed(&log[..10]);
        out.extend(r.feed(&log[10..50]));
        out.extend(r.feed(&log[50..]));
        assert_eq!(out, b"line 0\nline 1\nline 2\n");
    }
}

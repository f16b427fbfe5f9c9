//! The reviewer's decisions, for the agent (`.fencefs/feedback`): `DIR/feedback.jsonl`, one
//! JSON line per decision, `{"ts":UNIX_SECONDS,"path":"a/b","hunks":[1,2]|null,
//! "decision":"applied"|"discarded","note":"…"|null}`. `stage apply` and `stage discard`
//! (the CLI and the control socket alike) append a line per path they carried out; a review
//! UI may append its own (per hunk). This module writes and reads the file; it never
//! rewrites it.
//!
//! Invariants: lines are only appended (O_APPEND, one `write` per batch, synced; mode
//! 0600, never through a symlink). Reading is bounded whatever the file's size: only its
//! last [`TAIL`] bytes are read and at most [`KEEP`] decisions kept; a line that does not
//! parse is skipped. A failure to write is logged, never fails the apply or discard it
//! records.

use super::StageError;
use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::apply::Report;
use super::changes::Change;
use super::render::status_line;

/// The file's name in DIR.
pub const FILE: &str = "feedback.jsonl";
/// How much of the file's end is read.
pub const TAIL: u64 = 1 << 20;
/// At most this many decisions are kept from a read.
pub const KEEP: usize = 1000;

/// One decision.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Decision {
    /// When (UNIX seconds).
    pub ts: u64,
    /// The workspace-relative path.
    pub path: String,
    /// The hunks decided (`stage hunks` numbers), or `None` for the whole path.
    #[serde(default)]
    pub hunks: Option<Vec<u32>>,
    /// `applied` or `discarded`.
    pub decision: String,
    /// The reviewer's note.
    #[serde(default)]
    pub note: Option<String>,
}

/// Now, in UNIX seconds.
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The paths of `list` (the changes an apply or discard was given) that `report` says were
/// carried out (`applied …` / `discarded …` lines), as decisions.
pub fn decided(list: &[Change], report: &Report, op: &str, note: Option<&str>) -> Vec<Decision> {
    let word = if op == "apply" {
        "applied"
    } else {
        "discarded"
    };
    let done: std::collections::HashSet<&str> = report
        .lines
        .iter()
        .filter_map(|l| l.strip_prefix(word).and_then(|r| r.strip_prefix(' ')))
        .collect();
    let ts = now();
    let mut out: Vec<Decision> = list
        .iter()
        .filter(|c| done.contains(status_line(c).as_str()))
        .map(|c| Decision {
            ts,
            path: String::from_utf8_lossy(&c.path).into_owned(),
            hunks: None,
            decision: word.to_string(),
            note: note.map(str::to_string),
        })
        .collect();
    // A directory discarded whole (`discarded d/`) is one decision.
    for l in &done {
        if let Some(d) = l.strip_suffix('/')
            && !d.contains(' ')
            && !out.iter().any(|x| x.path == d)
        {
            out.push(Decision {
                ts,
                path: d.to_string(),
                hunks: None,
                decision: word.to_string(),
                note: note.map(str::to_string),
            });
        }
    }
    out
}

/// The longest note kept (longer ones are cut at a character boundary).
pub const MAX_NOTE: usize = 4096;

/// One decision a review UI made (`fencefs review`'s hunks: `stage apply|discard` record
/// whole paths themselves): `decision` is `apply` or `discard`, `hunks` empty for the
/// whole path, `note` empty for none.
pub fn append_one(
    dir: &Path,
    path: &str,
    hunks: &[usize],
    decision: &str,
    note: &str,
) -> Result<(), StageError> {
    let word = match decision {
        "apply" | "applied" => "applied",
        "discard" | "discarded" => "discarded",
        _ => {
            return Err(format!("feedback: decision '{decision}' is not apply or discard").into());
        }
    };
    let mut cut = note.len().min(MAX_NOTE);
    while !note.is_char_boundary(cut) {
        cut -= 1;
    }
    let d = Decision {
        ts: now(),
        path: path.to_string(),
        hunks: (!hunks.is_empty()).then(|| hunks.iter().map(|&h| h as u32).collect()),
        decision: word.to_string(),
        note: (cut > 0).then(|| note[..cut].to_string()),
    };
    append(dir, &[d]);
    Ok(())
}

/// Appends `ds` to `DIR/feedback.jsonl` (logged on failure).
pub fn append(dir: &Path, ds: &[Decision]) {
    if ds.is_empty() {
        return;
    }
    let mut text = Vec::new();
    for d in ds {
        if let Ok(l) = serde_json::to_vec(d) {
            text.extend(l);
            text.push(b'\n');
        }
    }
    let path = dir.join(FILE);
    let res = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .and_then(|mut f| {
            f.write_all(&text)?;
            f.sync_all()
        });
    if let Err(e) = res {
        log::warn!("{}: {e}", path.display());
    }
}

/// The last [`KEEP`] decisions of `DIR/feedback.jsonl` (none when it is missing), oldest
/// first, read from the file's last [`TAIL`] bytes.
pub fn read(dir: &Path) -> std::io::Result<Vec<Decision>> {
    let mut f = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir.join(FILE))
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let len = f.metadata()?.len();
    let start = len.saturating_sub(TAIL);
    f.seek(SeekFrom::Start(start))?;
    let mut buf = Vec::new();
    f.take(TAIL).read_to_end(&mut buf)?;
    // A read that starts mid-file starts mid-line: that part is dropped.
    let body = match (start, buf.iter().position(|&b| b == b'\n')) {
        (0, _) => &buf[..],
        (_, Some(i)) => &buf[i + 1..],
        (_, None) => &[][..],
    };
    let mut out: Vec<Decision> = body
        .split(|&b| b == b'\n')
        .filter_map(|l| serde_json::from_slice::<Decision>(l).ok())
        .filter(|d| d.decision == "applied" || d.decision == "discarded")
        .collect();
    if out.len() > KEEP {
        out.drain(..out.len() - KEEP);
    }
    Ok(out)
}

/// An RFC 3339 UTC time as the checkpoint log writes it (`2026-12-06T03:40:12.001Z`), in
/// UNIX seconds.
pub fn rfc3339_secs(s: &str) -> Option<u64> {
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(days * 86_400 + h * 3600 + mi * 60 + sec).ok()
}

/// Where the agent's feedback starts: the time of the checkpoint before the last one in
/// DIR's log (the start of the turn the reviewer reviewed; `0` with fewer than two).
pub fn since(dir: &Path) -> u64 {
    let log = super::layers::log(dir).unwrap_or_default();
    match log.len() {
        0 | 1 => 0,
        n => rfc3339_secs(&log[n - 2].ts).unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_matches_known_times() {
        assert_eq!(rfc3339_secs("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            rfc3339_secs("2026-12-06T03:40:12.001Z"),
            Some(1_796_528_412)
        );
        assert_eq!(rfc3339_secs("2000-02-29T12:00:00Z"), Some(951_825_600));
        assert_eq!(rfc3339_secs("bad"), None);
    }

    #[test]
    fn reads_are_bounded_and_skip_bad_lines() {
        let d = std::env::temp_dir().join(format!("fencefs-feedback-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let mk = |i: u64| Decision {
            ts: i,
            path: format!("p{i}"),
            hunks: i.is_multiple_of(2).then(|| vec![1, 2]),
            decision: "discarded".into(),
            note: Some("n".into()),
        };
        let ds: Vec<Decision> = (0..1500).map(mk).collect();
        append(&d, &ds[..10]);
        std::fs::OpenOptions::new()
            .append(true)
            .open(d.join(FILE))
            .unwrap()
            .write_all(b"not json\n{\"ts\":1,\"path\":\"x\",\"decision\":\"approved\"}\n")
            .unwrap();
        append(&d, &ds[10..]);
        let r = read(&d).unwrap();
        assert_eq!(r.len(), KEEP);
        assert_eq!(r.last(), ds.last());
        assert_eq!(r[0], ds[500]);
        std::fs::remove_dir_all(&d).unwrap();
    }
}

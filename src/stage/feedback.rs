//! The reviewer's decisions, for the agent: `DIR/feedback.jsonl`, one JSON line per
//! decision `{"ts","path","hunks","decision","note"}` (`hunks`: the hunk numbers, empty
//! for the whole path; `decision`: `apply` or `discard`; `note`: the reviewer's words,
//! at most [`MAX_NOTE`] bytes). `fencefs review` writes it (directly with `--dir`, through
//! the control socket's `feedback` op otherwise); `.fencefs/feedback` reads it.
//!
//! Invariants: append-only, each line written whole with one `write` and synced; the file
//! is made mode 0600 and never followed through a symlink.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The longest note kept (longer ones are cut at a character boundary).
pub const MAX_NOTE: usize = 4096;

/// The file's name in DIR.
pub const FILE: &str = "feedback.jsonl";

/// Appends one decision to `DIR/feedback.jsonl`.
pub fn append(
    dir: &Path,
    path: &str,
    hunks: &[usize],
    decision: &str,
    note: &str,
) -> Result<(), String> {
    if !matches!(decision, "apply" | "discard") {
        return Err(format!(
            "feedback: decision '{decision}' is not apply or discard"
        ));
    }
    let mut cut = note.len().min(MAX_NOTE);
    while !note.is_char_boundary(cut) {
        cut -= 1;
    }
    let line = serde_json::json!({
        "ts": crate::audit::timestamp(std::time::SystemTime::now()),
        "path": path,
        "hunks": hunks,
        "decision": decision,
        "note": &note[..cut],
    });
    let p = dir.join(FILE);
    let mut buf = line.to_string().into_bytes();
    buf.push(b'\n');
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&p)
        .and_then(|mut f| {
            f.write_all(&buf)?;
            f.sync_all()
        })
        .map_err(|e| format!("{}: {e}", p.display()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn one_line_per_decision_note_cut() {
        let d = std::env::temp_dir().join(format!("fencefs-feedback-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        super::append(&d, "a.rs", &[2], "discard", "no: keep the old API").unwrap();
        super::append(&d, "b.rs", &[], "apply", &"é".repeat(3000)).unwrap();
        assert!(super::append(&d, "b.rs", &[], "maybe", "").is_err());
        let text = std::fs::read_to_string(d.join(super::FILE)).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["path"], "a.rs");
        assert_eq!(lines[0]["hunks"], serde_json::json!([2]));
        assert_eq!(lines[0]["decision"], "discard");
        assert_eq!(lines[0]["note"], "no: keep the old API");
        assert_eq!(lines[1]["note"].as_str().unwrap().len(), 4096);
        std::fs::remove_dir_all(&d).unwrap();
    }
}

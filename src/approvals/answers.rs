//! Answers remembered for good (`--answers FILE`, SPEC.md "Approvals"): an approver's
//! `"remember":"always"` is appended to FILE as one `[[answer]]` table, and every later
//! request an `ask` rule would put to a person is first looked up here.
//!
//! Invariants:
//! - FILE is edited with `toml_edit`: what a person wrote (comments, order, spacing) is
//!   kept; an answer is appended to the file as it is on disk then (a hand edit made since
//!   the last load is not lost), written to a temporary file beside it and renamed over it.
//! - An invalid FILE (at start or on reload) is reported with file:line:column like an
//!   invalid policy, and the answers in force stay as they were.
//! - Answers only decide what an `ask` rule puts to a person: the caller consults them only
//!   for a refusal an `ask` covers, so they never lift `none`, the mode, or a path without
//!   `ask`. An answer is per uid; for a directory it covers everything below it.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use toml_edit::{ArrayOfTables, DocumentMut, Item, Table, value};

use crate::policy::PolicyError;
use crate::policy::build::line_col;

/// One remembered answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// Workspace path (and, for a directory, everything below it).
    pub path: String,
    /// `write` (covers `read` too) or `read`.
    pub write: bool,
    /// The caller's uid it answers for.
    pub uid: u32,
    /// Allow, or refuse without asking.
    pub allow: bool,
    /// Who answered (`uid N`, as the approver was seen), for the person reviewing.
    pub by: String,
    /// When (RFC 3339, UTC).
    pub ts: String,
}

impl Answer {
    /// Whether it answers `uid` needing `write` (else read) on `path`.
    fn covers(&self, uid: u32, path: &[u8], write: bool) -> bool {
        let base = self.path.as_bytes();
        self.uid == uid
            && (self.write || !write)
            && (base.is_empty()
                || path == base
                || (path.len() > base.len() && path.starts_with(base) && path[base.len()] == b'/'))
    }
}

/// The answers file and the answers in force.
pub struct Answers {
    file: PathBuf,
    list: Mutex<Vec<Answer>>,
    /// One writer at a time (read, append, rename).
    write: Mutex<()>,
}

fn err(file: &str, src: &str, at: Option<usize>, message: String) -> PolicyError {
    let (line, column) = at.map_or((0, 0), |o| line_col(src, o));
    PolicyError {
        file: file.to_string(),
        line,
        column,
        message,
    }
}

/// Parses FILE's text: its answers, or every error with its position.
pub fn parse(file: &str, src: &str) -> Result<(DocumentMut, Vec<Answer>), Vec<PolicyError>> {
    let doc = toml_edit::Document::parse(src.to_string()).map_err(|e| {
        vec![err(
            file,
            src,
            e.span().map(|s| s.start),
            e.message().trim().to_string(),
        )]
    })?;
    let mut errors = Vec::new();
    let mut list = Vec::new();
    for (k, item) in doc.as_table().iter() {
        if k != "answer" {
            let at = doc
                .as_table()
                .key(k)
                .and_then(|k| k.span())
                .map(|s| s.start);
            errors.push(err(
                file,
                src,
                at,
                format!("unknown key `{k}` (expected [[answer]])"),
            ));
            continue;
        }
        let Some(tables) = item.as_array_of_tables() else {
            let at = item.span().map(|s| s.start);
            errors.push(err(
                file,
                src,
                at,
                "`answer` must be [[answer]] tables".into(),
            ));
            continue;
        };
        for t in tables.iter() {
            match one(t) {
                Ok(a) => list.push(a),
                Err((at, m)) => {
                    let at = at.or(t.span().map(|s| s.start));
                    errors.push(err(file, src, at, m));
                }
            }
        }
    }
    if errors.is_empty() {
        Ok((doc.into_mut(), list))
    } else {
        Err(errors)
    }
}

type Bad = (Option<usize>, String);

/// One `[[answer]]` table.
fn one(t: &Table) -> Result<Answer, Bad> {
    for (k, item) in t.iter() {
        if !["path", "op", "uid", "allow", "by", "ts"].contains(&k) {
            let at = t
                .key(k)
                .and_then(|k| k.span())
                .or(item.span())
                .map(|s| s.start);
            return Err((at, format!("unknown key `{k}` in [[answer]]")));
        }
    }
    let at = |k: &str| t.get(k).and_then(Item::span).map(|s| s.start);
    let need = |k: &str| -> Result<&Item, Bad> {
        t.get(k).ok_or((None, format!("[[answer]] needs `{k}`")))
    };
    let path = need("path")?
        .as_str()
        .ok_or((at("path"), "`path` must be a string".into()))?;
    let path = path.trim_matches('/').to_string();
    if path.split('/').any(|c| c == ".." || c == ".") {
        return Err((at("path"), "`path` must not contain `.` or `..`".into()));
    }
    let write = match need("op")?.as_str() {
        Some("write") => true,
        Some("read") => false,
        _ => return Err((at("op"), "`op` must be \"read\" or \"write\"".into())),
    };
    let uid = need("uid")?
        .as_integer()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or((at("uid"), "`uid` must be a uid (0..=4294967295)".into()))?;
    let allow = need("allow")?
        .as_bool()
        .ok_or((at("allow"), "`allow` must be true or false".into()))?;
    let text = |k: &str| -> Result<String, Bad> {
        match t.get(k) {
            None => Ok(String::new()),
            Some(i) => i
                .as_str()
                .map(str::to_string)
                .ok_or((at(k), format!("`{k}` must be a string"))),
        }
    };
    Ok(Answer {
        path,
        write,
        uid,
        allow,
        by: text("by")?,
        ts: text("ts")?,
    })
}

/// Reads and parses FILE; a missing FILE has no answers.
pub fn read(file: &Path) -> Result<(DocumentMut, Vec<Answer>), Vec<PolicyError>> {
    let name = file.display().to_string();
    let src = match std::fs::read_to_string(file) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(vec![err(&name, "", None, e.to_string())]),
    };
    parse(&name, &src)
}

impl Answers {
    /// Loads FILE (at start: an invalid FILE is an error, as an invalid policy is).
    pub fn load(file: &Path) -> Result<Answers, Vec<PolicyError>> {
        let (_, list) = read(file)?;
        Ok(Answers {
            file: file.to_path_buf(),
            list: Mutex::new(list),
            write: Mutex::new(()),
        })
    }

    /// Re-reads FILE (on reload); on error the answers in force stay.
    pub fn reload(&self) -> Result<usize, Vec<PolicyError>> {
        let _w = self.write.lock();
        let (_, list) = read(&self.file)?;
        let n = list.len();
        *self.list.lock() = list;
        Ok(n)
    }

    /// The answer for `uid` needing `write` (else read) on every one of `paths`: allow
    /// when every path is allowed, refuse when one is refused, `None` when one has none.
    pub fn lookup<'a>(
        &self,
        uid: u32,
        paths: impl IntoIterator<Item = (&'a [u8], bool)>,
    ) -> Option<bool> {
        let list = self.list.lock();
        let mut all = true;
        for (path, write) in paths {
            // The latest answer for a path wins (a person may append a correction).
            match list.iter().rev().find(|a| a.covers(uid, path, write)) {
                Some(a) => all &= a.allow,
                None => return None,
            }
        }
        Some(all)
    }

    /// Appends `answers` to FILE (as it is on disk now) and puts them in force.
    pub fn remember(&self, answers: Vec<Answer>) -> Result<(), String> {
        let _w = self.write.lock();
        let (mut doc, _) = read(&self.file).map_err(|e| {
            let first = e.first().map(ToString::to_string).unwrap_or_default();
            format!("the answers file is invalid, not written: {first}")
        })?;
        // A file of comments only: they are the document's trailing text, which would
        // end up below the first answer; they stay above it.
        let mut lead = String::new();
        if doc.get("answer").is_none() {
            lead = doc.trailing().as_str().unwrap_or("").to_string();
            doc.set_trailing("");
            doc.insert("answer", Item::ArrayOfTables(ArrayOfTables::new()));
        }
        let tables = doc["answer"]
            .as_array_of_tables_mut()
            .ok_or("`answer` in the answers file is not [[answer]] tables")?;
        for a in &answers {
            let mut t = Table::new();
            t.insert("path", value(a.path.as_str()));
            t.insert("op", value(if a.write { "write" } else { "read" }));
            t.insert("uid", value(i64::from(a.uid)));
            t.insert("allow", value(a.allow));
            t.insert("by", value(a.by.as_str()));
            t.insert("ts", value(a.ts.as_str()));
            if !lead.is_empty() {
                t.decor_mut().set_prefix(std::mem::take(&mut lead));
            }
            tables.push(t);
        }
        let text = doc.to_string();
        let name = self
            .file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = self.file.with_file_name(format!(".{name}.fencefs-tmp"));
        let put = || -> std::io::Result<()> {
            // The rewrite keeps the file's mode and owner; a new file is the operator's
            // alone (0600), whatever the daemon's umask.
            let (mode, owner) = match std::fs::metadata(&self.file) {
                Ok(md) => (md.mode() & 0o7777, Some((md.uid(), md.gid()))),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    (crate::private_file::FILE_MODE, None)
                }
                Err(e) => return Err(e),
            };
            crate::private_file::write_synced(&tmp, text.as_bytes(), mode, owner)?;
            std::fs::rename(&tmp, &self.file)
        };
        put().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            format!("{}: {e}", self.file.display())
        })?;
        self.list.lock().extend(answers);
        Ok(())
    }

    /// The answers in force.
    pub fn list(&self) -> Vec<Answer> {
        self.list.lock().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_reports_positions_and_covers() {
        let src = "# mine\n[[answer]]\npath = \"docs\"\nop = \"write\"\nuid = 1000\nallow = true\n";
        let (_, l) = parse("a.toml", src).unwrap();
        assert_eq!(l.len(), 1);
        assert!(l[0].covers(1000, b"docs/x", true));
        assert!(l[0].covers(1000, b"docs", false));
        assert!(!l[0].covers(1001, b"docs/x", true));
        assert!(!l[0].covers(1000, b"docsx", true));
        let e = parse(
            "a.toml",
            "[[answer]]\npath = \"d\"\nop = \"exec\"\nuid = 1\nallow = true\n",
        )
        .unwrap_err();
        assert_eq!(
            e[0].to_string(),
            "a.toml:3:6: `op` must be \"read\" or \"write\""
        );
        let e = parse("a.toml", "[[answer]\n").unwrap_err();
        assert_eq!((e[0].line, e[0].file.as_str()), (1, "a.toml"));
    }
}

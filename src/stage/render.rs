//! The engine's presentation: how a change, a path and a change's JSON object are shown
//! by `fencefs stage` and answered on the control socket (`status_line`, `json`,
//! `json_in`, `quote`). Both front-ends (`cli.rs`, `control.rs`) and the engine's reports
//! (`apply.rs`, `discard.rs`, `ids.rs`) use these, so the text is the same whichever
//! way it is asked for.
//!
//! Invariants: pure (no I/O but [`json_in`]'s read of the staged file's size); no byte of
//! a name reaches the text raw (names are quoted as git quotes them with
//! `core.quotePath`). Depends on `changes.rs` and `space.rs` only, never on a front-end.

use super::changes::{Change, Kind, Layers};
use super::space::add_json;

/// A path as git prints it: as is when plain, else in double quotes with C escapes and
/// octal for control characters, `"`, `\` and every byte ≥ 0x80.
pub fn quote(p: &[u8]) -> String {
    crate::quote::quote_git(p).into_owned()
}

/// A status line: letters, the path (quoted as git does), `/` for a directory.
pub fn status_line(c: &Change) -> String {
    let slash = |p: &[u8], dir: bool| {
        let mut q = quote(p);
        if dir {
            q.push('/');
        }
        q
    };
    let path = slash(&c.path, c.dir);
    match (&c.kind, c.entries) {
        (Kind::Renamed { from }, _) => {
            format!("{} {} -> {}", c.letters(), slash(from, c.dir), path)
        }
        (Kind::Added, Some(n)) => format!(
            "{} {path} ({n} {})",
            c.letters(),
            if n == 1 { "entry" } else { "entries" }
        ),
        _ => format!("{} {path}", c.letters()),
    }
}

/// `--json`: one object per change, with its review `id` ([`super::ids`]).
pub fn json(c: &Change, id: &str) -> serde_json::Value {
    let s = |p: &[u8]| String::from_utf8_lossy(p).into_owned();
    let mut v = serde_json::json!({
        "path": s(&c.path),
        "change": c.word(),
        "conflict": c.conflict,
        "id": id,
    });
    if let Kind::Renamed { from } = &c.kind {
        v["from"] = s(from).into();
    }
    if let Some(n) = c.entries {
        v["entries"] = n.into();
    }
    v
}

/// [`json`] with the staged file's size when it is large or sparse (`"size"`,
/// `"allocated"`, `"sparse"`: [`super::space::add_json`]).
pub fn json_in(l: &Layers, c: &Change, id: &str) -> serde_json::Value {
    let mut v = json(c, id);
    add_json(&mut v, l, c);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_quoted_as_git_quotes_them() {
        assert_eq!(quote(b"src/a.rs"), "src/a.rs");
        assert_eq!(quote(b"a\tb"), "\"a\\tb\"");
        assert_eq!(quote("é".as_bytes()), "\"\\303\\251\"");
        assert_eq!(quote(b"q\"\\"), "\"q\\\"\\\\\"");
    }
}

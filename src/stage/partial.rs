//! Single hunks of a staged text file: `stage hunks PATH` (the numbered list) and
//! `stage apply|discard PATH#N[,M…][@ID]`.
//!
//! Applying hunks writes SOURCE's file anew as SOURCE's version with those hunks carried
//! over ([`super::hunks::FileDiff::with`]): beside it (the apply's temporary name, named
//! in the intent log), synced, and put in place by the apply's last-look guard
//! (`guard::replace`: a host save meanwhile is a conflict, never overwritten);
//! SOURCE's mode, owner and xattrs are kept. The staged copy stays the agent's full
//! version and its base record moves to the new SOURCE file, so what stays staged is
//! exactly the other hunks. Discarding hunks rewrites the staged copy as SOURCE's
//! version with every other hunk carried over: a new file in `DIR/scratch` with the
//! staged copy's owner, mode and xattrs (its base record included), synced, renamed over
//! it (same file system), its directory synced. Naming every hunk is the whole path's
//! apply or discard.
//!
//! Only a modified regular file whose two sides are text (no NUL in the first 8000
//! bytes) of at most [`MAX_FILE`] bytes has hunks. Memory: the two versions, the result
//! (at most their sum) and the diff's tables (`hunks.rs`: 17–33 bytes a line, 16 MiB at
//! most for the LCS): for a 50 MB file about 4× its size.
//!
//! Invariants: the caller holds DIR's lock or has quiesced the mount, and has squashed
//! the checkpoints (one staged tree over SOURCE); `@ID` is checked against that tree
//! before anything is written; a refused request writes nothing.

use super::StageError;
use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use super::base::{self, Base};
use super::changes::{Change, Kind, Layers};
use super::hunks::FileDiff;
use super::remove::sync_dir;
use super::render::quote;
use super::tree::{Node, kind, split};
use super::{guard, ids, intent};
use crate::host::sys::{self, Name, SetTime};

/// The largest file (either side) with hunks.
pub const MAX_FILE: u64 = 256 << 20;

/// `PATH#N[,M…][@ID]`.
#[derive(Debug, PartialEq)]
pub struct HunkArg {
    /// The path.
    pub path: Vec<u8>,
    /// The hunk numbers (from 1, sorted, without repeats).
    pub hunks: Vec<usize>,
    /// The review id it must still have.
    pub id: Option<String>,
}

/// Reads `PATH#N[,M…][@ID]` (`None`: no `#` list of numbers at the end, a plain path).
pub fn parse(arg: &[u8]) -> Option<HunkArg> {
    let (p, id) = ids::split_arg(arg);
    let hash = p.iter().rposition(|&b| b == b'#')?;
    let (path, spec) = (&p[..hash], &p[hash + 1..]);
    if path.is_empty() || spec.is_empty() {
        return None;
    }
    let mut hunks = Vec::new();
    for part in spec.split(|&b| b == b',') {
        let n: usize = std::str::from_utf8(part).ok()?.parse().ok()?;
        if n == 0 || !part.iter().all(u8::is_ascii_digit) {
            return None;
        }
        hunks.push(n);
    }
    hunks.sort_unstable();
    hunks.dedup();
    Some(HunkArg {
        path: path.to_vec(),
        hunks,
        id: id.map(str::to_string),
    })
}

/// A staged text file's two versions.
pub struct Text {
    /// Its change.
    pub change: Change,
    /// SOURCE's file and bytes.
    pub low: Node,
    /// The staged file and bytes.
    pub up: Node,
    /// SOURCE's bytes.
    pub old: Vec<u8>,
    /// The staged bytes.
    pub new: Vec<u8>,
}

fn binary(b: &[u8]) -> bool {
    b[..b.len().min(8000)].contains(&0)
}

/// The staged text file at `path` of `l` (an error says why it has no hunks).
pub fn text(l: &Layers, path: &[u8]) -> Result<Text, StageError> {
    let q = quote(path);
    let list = l
        .changes()
        .map_err(StageError::op("reading the staged tree"))?;
    let c = list
        .into_iter()
        .find(|c| c.path == path)
        .ok_or_else(|| format!("{q}: nothing staged there"))?;
    let whole = |what: &str| -> StageError {
        format!("{q}: {what}: only the whole path can be applied or discarded (no #N)").into()
    };
    if c.kind != Kind::Modified || c.dir {
        return Err(whole(&format!("a {} change has no hunks", c.word())));
    }
    let io = |e: io::Error| StageError::op(q.clone())(e);
    let low = l
        .lower
        .get(path)
        .map_err(io)?
        .ok_or_else(|| whole("gone"))?;
    let up = l
        .upper
        .get(path)
        .map_err(io)?
        .ok_or_else(|| whole("gone"))?;
    if kind(&low.st) != libc::S_IFREG || kind(&up.st) != libc::S_IFREG {
        return Err(whole("not a regular file"));
    }
    let read = |layer: &super::tree::Layer, n: &Node| {
        layer
            .read(n, MAX_FILE)
            .map_err(io)?
            .ok_or_else(|| whole(&format!("over {} MiB", MAX_FILE >> 20)))
    };
    let old = read(l.lower.source(), &low)?;
    let new = read(&l.upper, &up)?;
    if binary(&old) || binary(&new) {
        return Err(whole("a binary file"));
    }
    Ok(Text {
        change: c,
        low,
        up,
        old,
        new,
    })
}

/// `stage hunks PATH`: `PATH@ID: N hunks`, then each hunk as `#N @@ … @@` and its lines
/// as `stage diff` writes them.
pub fn write_list(l: &Layers, path: &[u8], out: &mut impl Write) -> Result<(), StageError> {
    let t = text(l, path)?;
    let id = ids::id(l, &t.change).map_err(StageError::op("review id"))?;
    let f = FileDiff::new(&t.old, &t.new);
    let n = f.hunks().len();
    let w = StageError::Sys;
    writeln!(
        out,
        "{}@{id}: {n} hunk{}",
        quote(path),
        if n == 1 { "" } else { "s" }
    )
    .map_err(w)?;
    for (i, h) in f.hunks().iter().enumerate() {
        write!(out, "#{} ", i + 1).map_err(w)?;
        f.write_hunk(h, out).map_err(w)?;
    }
    Ok(())
}

/// `stage hunks PATH --json` (and the control socket's answer): the path, its id and
/// change, and each hunk's number, header and lines (a tag, then the line escaped for a
/// terminal without its newline; `\` for git's "No newline at end of file").
pub fn list_json(l: &Layers, path: &[u8]) -> Result<serde_json::Value, StageError> {
    let t = text(l, path)?;
    let id = ids::id(l, &t.change).map_err(StageError::op("review id"))?;
    let f = FileDiff::new(&t.old, &t.new);
    let hunks: Vec<serde_json::Value> = f
        .hunks()
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let mut lines = Vec::new();
            for (tag, line) in f.body(h) {
                let bare = line.strip_suffix(b"\n").unwrap_or(line);
                lines.push(format!("{}{}", tag as char, crate::quote::escape(bare)));
                if !line.ends_with(b"\n") {
                    lines.push("\\ No newline at end of file".to_string());
                }
            }
            serde_json::json!({"n": i + 1, "header": f.header(h), "lines": lines})
        })
        .collect();
    Ok(serde_json::json!({
        "path": String::from_utf8_lossy(path),
        "id": id,
        "change": t.change.letters(),
        "hunks": hunks,
    }))
}

/// What a hunk request comes to.
pub enum Outcome {
    /// Done: the report line.
    Done(String),
    /// Refused: the report line.
    Refused(String),
    /// Every hunk named: the whole path's apply or discard does it.
    Whole(Box<Change>),
}

/// Applies (`apply`) or discards the hunks `a` names; `dir` is the staging area.
pub fn run(l: &Layers, dir: &Path, apply: bool, a: &HunkArg, force: bool) -> Outcome {
    let nums = a
        .hunks
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let shown = format!("{}#{nums}", quote(&a.path));
    let refused = |why: String| Outcome::Refused(format!("refused {shown}: {why}"));
    let t = match text(l, &a.path) {
        Ok(t) => t,
        Err(e) => return refused(e.to_string()),
    };
    let line = format!("{} {shown}", t.change.letters());
    if let Some(want) = &a.id {
        match ids::id(l, &t.change) {
            Ok(now) if now == *want => {}
            Ok(now) => {
                return Outcome::Refused(format!(
                    "refused {line}@{want}: changed since it was shown (now @{now}): review it again"
                ));
            }
            Err(e) => return refused(format!("review id: {e}")),
        }
    }
    if apply && t.change.conflict && !force {
        return Outcome::Refused(format!(
            "refused {line}: conflict (SOURCE changed after it was staged; --force applies the staged version)"
        ));
    }
    let f = FileDiff::new(&t.old, &t.new);
    let total = f.hunks().len();
    if let Some(&bad) = a.hunks.iter().find(|&&n| n > total) {
        return Outcome::Refused(format!("refused {line}: no hunk {bad} (it has {total})"));
    }
    if a.hunks.len() == total {
        return Outcome::Whole(Box::new(t.change));
    }
    let keep = |n: usize| a.hunks.binary_search(&n).is_ok();
    let left = total - a.hunks.len();
    let res = if apply {
        let bytes = f.with(keep);
        drop(f);
        write_source(l, dir, &t, &bytes)
    } else {
        let bytes = f.with(|n| !keep(n));
        drop(f);
        write_staged(l, dir, &t, &bytes)
    };
    match res {
        Ok(()) => Outcome::Done(format!(
            "{} {line} ({left} hunk{} still staged)",
            if apply { "applied" } else { "discarded" },
            if left == 1 { "" } else { "s" }
        )),
        Err(e) => Outcome::Refused(format!("refused {line}: {e}")),
    }
}

/// Writes `bytes` to a new file `dir/t` (mode 0600, not following anything), synced.
fn write_new(dir: BorrowedFd<'_>, t: &Name, bytes: &[u8]) -> io::Result<OwnedFd> {
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    let f = sys::openat(dir, t, flags, 0o600)?;
    let mut done = 0;
    while done < bytes.len() {
        done += sys::pwrite(f.as_fd(), &bytes[done..], done as u64)?;
    }
    Ok(f)
}

/// SOURCE's file becomes `bytes` (see the module's header), and the staged copy's base
/// record names the new file.
fn write_source(l: &Layers, dir: &Path, t: &Text, bytes: &[u8]) -> io::Result<()> {
    let path = &t.change.path;
    let (parent, last) = split(path);
    let pdir = l
        .lower
        .dir(parent)?
        .ok_or_else(|| {
            io::Error::other(format!(
                "SOURCE parent '{}' is not a directory",
                quote(parent)
            ))
        })?
        .fd;
    let n = Name::new(last)?;
    let tmp = intent::tmp_name(last, "apply", std::process::id())?;
    intent::write(dir, &[path.as_slice()]).map_err(io::Error::other)?;
    let res = (|| {
        let f = write_new(pdir.as_fd(), &tmp, bytes)?;
        let st = &t.low.st;
        sys::fchown_fd(f.as_fd(), st.st_uid, st.st_gid)?;
        super::sys::file::fchmod(f.as_fd(), st.st_mode & 0o7777)?;
        for (k, v) in l.lower.xattrs(&t.low) {
            super::sys::file::set(f.as_fd(), &k, &v)?;
        }
        sys::fsync(f.as_fd(), false)?;
        guard::replace(&t.change, pdir.as_fd(), &tmp, &n, Some(&t.low))
    })();
    if res.is_err() {
        if sys::fstatat_nofollow(pdir.as_fd(), &tmp).is_ok() {
            let _ = sys::unlinkat(pdir.as_fd(), &tmp, 0);
        }
        let _ = intent::clear(dir);
    }
    res?;
    sync_dir(l.lower.source(), pdir.as_fd())?;
    // The staged copy is now based on the file just written: a host edit of it from now
    // on is a conflict (its ctime is past the record's time; the same clock tick as the
    // rename is not seen).
    let now = sys::open_path(pdir.as_fd(), &n)?;
    let st = sys::fstat(now.as_fd())?;
    let btime = super::sys::btime_fd(now.as_fd())?.unwrap_or(0);
    let b = Base {
        ino: st.st_ino,
        btime,
        since: base::ns(st.st_ctime, st.st_ctime_nsec) + 1,
        path: path.as_slice().into(),
    };
    sys::setxattr_fd(t.up.fd.as_fd(), &base::xattr_name(), &b.encode(), 0)?;
    // Its overlayfs origin was the file just replaced.
    let _ = sys::removexattr_fd(t.up.fd.as_fd(), b"trusted.overlay.origin");
    let _ = intent::clear(dir);
    Ok(())
}

/// The staged copy becomes `bytes` (see the module's header).
fn write_staged(l: &Layers, dir: &Path, t: &Text, bytes: &[u8]) -> io::Result<()> {
    if t.up.st.st_nlink > 1 {
        return Err(io::Error::other(
            "the staged file has other names: discard the whole path",
        ));
    }
    let path = &t.change.path;
    let (parent, last) = split(path);
    let udir = l
        .upper
        .dir(parent)?
        .ok_or_else(|| io::Error::other("staged parent is gone"))?;
    let scratch = super::view::scratch_dir(dir).map_err(io::Error::other)?;
    let sd = sys::open_root(scratch.path())?;
    let tmp = Name::new(b"hunks")?;
    let f = write_new(sd.as_fd(), &tmp, bytes)?;
    let st = &t.up.st;
    sys::fchown_fd(f.as_fd(), st.st_uid, st.st_gid)?;
    super::sys::file::fchmod(f.as_fd(), st.st_mode & 0o7777)?;
    let src = sys::reopen(l.upper.proc_fd.as_fd(), t.up.fd.as_fd(), libc::O_RDONLY)?;
    let names = super::sys::file::list(src.as_fd())?;
    for k in names.split(|&b| b == 0).filter(|k| !k.is_empty()) {
        let v = super::sys::file::get(src.as_fd(), k)?;
        super::sys::file::set(f.as_fd(), k, &v)?;
    }
    if base::of(&t.up).is_none() {
        // No record: the staged copy's own birth stood for it; the new copy is born now,
        // so the record keeps that time (a host edit since the agent's copy stays a
        // conflict).
        let was = super::sys::staged_at_fd(src.as_fd())?;
        let b = Base {
            ino: t.low.st.st_ino,
            btime: super::sys::btime_fd(t.low.fd.as_fd())?.unwrap_or(0),
            since: was,
            path: path.as_slice().into(),
        };
        super::sys::file::set(f.as_fd(), &base::xattr_name(), &b.encode())?;
    }
    sys::utimens_fd(
        l.upper.proc_fd.as_fd(),
        f.as_fd(),
        SetTime::Now,
        SetTime::Now,
    )?;
    sys::fsync(f.as_fd(), false)?;
    sys::renameat2(sd.as_fd(), &tmp, udir.fd.as_fd(), &Name::new(last)?, 0)?;
    sync_dir(&l.upper, udir.fd.as_fd())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hunk_arguments() {
        let a = parse(b"src/a.rs#3,1,3@0123456789abcdef").unwrap();
        assert_eq!(a.path, b"src/a.rs");
        assert_eq!(a.hunks, vec![1, 3]);
        assert_eq!(a.id.as_deref(), Some("0123456789abcdef"));
        assert_eq!(parse(b"a#2").unwrap().hunks, vec![2]);
        assert!(parse(b"a#0").is_none());
        assert!(parse(b"a#").is_none());
        assert!(parse(b"#1").is_none());
        assert!(parse(b"a#x").is_none());
        assert!(parse(b"a#+1").is_none());
        assert!(parse(b"issue#12/notes.md").is_none());
        assert!(parse(b"plain.txt").is_none());
    }
}

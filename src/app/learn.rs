//! `fencefs learn AUDIT.jsonl [--policy BASE]`: reads an audit log written with
//! `--audit-allowed` and prints a draft policy (the drafting itself is `learn.rs`).
//! Also a learning mount's draft file ([`LearnOut`]: `--learn OUT.toml`, written at
//! unmount and on the control socket's `{"cmd":"learn"}`).
//!
//! Invariants: OUT.toml is opened once, before the mount exists (a bad path fails the
//! mount before anything is mounted, and the workers' confinement never has to allow
//! it); every write replaces the whole file in place under one lock, so it always holds
//! one complete draft, the latest written, and an unmount after a `learn` command leaves
//! the unmount's draft (never a longer old one's tail).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;

use crate::fs::ops::Shared;

use crate::cli::LearnArgs;
use crate::learn::{Use, draft};
use crate::policy::{Access, Caller};

/// The access word of an audit line's `need`.
fn level(word: &str) -> Option<Access> {
    Access::ALL.into_iter().find(|a| a.as_str() == word)
}

/// The uses in audit text: allowed and would-deny lines with a `need`; (uses, lines
/// skipped because they do not parse).
pub fn uses(text: &str) -> (Vec<Use>, usize) {
    let mut out = Vec::new();
    let mut bad = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            bad += 1;
            continue;
        };
        if !matches!(v["decision"].as_str(), Some("allow" | "would-deny")) {
            continue;
        }
        let Some(need) = v["need"].as_str().and_then(level) else {
            continue;
        };
        let path = match (v["path"].as_str(), v["path_hex"].as_str()) {
            (_, Some(hex)) => (0..hex.len() / 2)
                .filter_map(|i| u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok())
                .collect(),
            (Some(p), None) => p.as_bytes().to_vec(),
            (None, None) => {
                bad += 1;
                continue;
            }
        };
        let id = |k: &str| {
            v[k].as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(0)
        };
        out.push(Use {
            path,
            need,
            caller: Caller::new(id("uid"), id("gid")),
        });
    }
    (out, bad)
}

/// Runs the command: the draft on stdout; 1 when the log cannot be read or the base
/// policy is invalid.
pub(super) fn learn(a: LearnArgs) -> i32 {
    let text = match std::fs::read_to_string(&a.audit) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("fencefs learn: {}: {e}", a.audit.display());
            return 1;
        }
    };
    let base = if a.policy.is_empty() {
        None
    } else {
        match crate::reload::load(&a.policy, None) {
            Ok(p) => Some(p),
            Err(errors) => {
                for e in errors {
                    eprintln!("{e}");
                }
                return 1;
            }
        }
    };
    let (uses, bad) = uses(&text);
    if bad > 0 {
        eprintln!(
            "fencefs learn: {bad} lines of {} are not audit lines; skipped",
            Path::new(&a.audit).display()
        );
    }
    let out = draft(&uses, base.as_ref());
    if let Err(e) = crate::policy::Policy::parse(&out, "<draft>") {
        eprintln!("fencefs learn: the draft does not parse (a bug): {e:?}");
        return 1;
    }
    crate::out!("{out}");
    0
}

/// `--learn OUT.toml`: where a learning mount writes its draft.
pub(crate) struct LearnOut {
    path: PathBuf,
    file: Mutex<File>,
}

/// What one write of the draft wrote.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Written {
    /// Rules in the draft.
    pub(crate) rules: usize,
    /// Bytes of the draft.
    pub(crate) bytes: usize,
}

impl LearnOut {
    /// Creates (or truncates) OUT.toml, a new one 0600 (the daemon's umask is 0); the
    /// error is the mount's one startup line.
    pub(crate) fn open(path: &Path) -> Result<LearnOut, String> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(crate::private_file::FILE_MODE)
            .open(path);
        let file = file.map_err(|e| {
            format!(
                "--learn {}: {e}",
                crate::quote::quote(path.as_os_str().as_encoded_bytes())
            )
        })?;
        // Canonical, for the answer's `path` (the daemon may chdir; the file stays).
        let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        Ok(LearnOut {
            path,
            file: Mutex::new(file),
        })
    }

    /// Where the draft goes.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Drafts what `shared` recorded so far and replaces OUT.toml's contents with it.
    pub(crate) fn write(&self, shared: &Shared) -> Result<Written, String> {
        let Some(rec) = &shared.settings.learn else {
            return Err("this mount does not learn (no --learn)".into());
        };
        // Drafted under the file's lock: two writers never leave the older draft last.
        let f = self.file.lock();
        let draft = rec.draft(&shared.policy.get().policy);
        let rules = crate::policy::Policy::parse(&draft, "<draft>")
            .map(|p| p.rules().len())
            .map_err(|e| format!("the draft does not parse (a bug): {e:?}"))?;
        let shown = self.path.display();
        f.set_len(0)
            .and_then(|()| f.write_all_at(draft.as_bytes(), 0))
            .and_then(|()| f.sync_data())
            .map_err(|e| format!("writing {shown}: {e}"))?;
        Ok(Written {
            rules,
            bytes: draft.len(),
        })
    }

    /// [`LearnOut::write`] at the end of a session, its outcome logged.
    pub(crate) fn write_logged(&self, shared: &Shared) {
        match self.write(shared) {
            Ok(w) => log::info!(
                "--learn: the draft policy is written to {} ({} rules)",
                self.path.display(),
                w.rules
            ),
            Err(e) => log::error!("--learn: {e}"),
        }
    }
}

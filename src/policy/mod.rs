//! The policy: parse a TOML policy file, compile it once, decide per request.
//!
//! PURE: no fuser, no file descriptors, no clock, no globals. (Reading the policy file in
//! [`Policy::load`] is the only I/O.)
//!
//! INTERFACE CONTRACT (the rest of the crate relies on exactly these signatures):
//! paths are workspace-relative byte strings: `b""` is the workspace root, components are
//! separated by a single `/`, never start or end with `/`, never contain `.`/`..` components.

use std::fmt;
use std::path::Path;

/// Access levels, a lattice: none < list < read < {create, append} < write. `create` and
/// `append` are incomparable (their meet is `read`, their join `write`), so there is no
/// `Ord`: compare with [`Access::includes`], combine with [`Access::meet`] /
/// [`Access::join`] (see `lattice.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// The path does not exist for the caller.
    None,
    /// lookup, stat, list a directory, readlink.
    List,
    /// open and read contents, xattrs, execute.
    Read,
    /// `read`, plus creating new files, directories and symlinks, and writing a file this
    /// uid created through the mount until its first close; nothing that existed changes.
    Create,
    /// `read`, plus writes with O_APPEND to existing files; no truncate, no other write.
    Append,
    /// every mutation.
    Write,
}

impl Access {
    /// The policy-file word: "none" | "list" | "read" | "create" | "append" | "write".
    pub fn as_str(self) -> &'static str {
        match self {
            Access::None => "none",
            Access::List => "list",
            Access::Read => "read",
            Access::Create => "create",
            Access::Append => "append",
            Access::Write => "write",
        }
    }
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Sandbox mode: a ceiling over the grants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// No mutations anywhere.
    ReadOnly,
    /// Mutations inside `writable_roots`, outside `protected`.
    WorkspaceWrite,
    /// Mutations wherever the grants allow.
    Danger,
}

impl Mode {
    /// "read-only" | "workspace-write" | "danger".
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::ReadOnly => "read-only",
            Mode::WorkspaceWrite => "workspace-write",
            Mode::Danger => "danger",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "read-only" => Ok(Mode::ReadOnly),
            "workspace-write" => Ok(Mode::WorkspaceWrite),
            "danger" => Ok(Mode::Danger),
            _ => Err(format!(
                "unknown mode '{s}' (expected read-only, workspace-write or danger)"
            )),
        }
    }
}

/// Who asks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Caller {
    /// Requesting uid.
    pub uid: u32,
    /// Requesting gid.
    pub gid: u32,
    /// The program rules (`exe` / `ancestor_exe`) whose programs the calling process
    /// matches: bit `i` is program rule `i` of the policy set (see
    /// [`Policy::match_programs`]). 0 when the policy has none.
    pub progs: u64,
    /// The calling process's program could not be known (the resolver's queue full or
    /// late, the process gone, a pid from outside the daemon's pid namespace): `progs` is
    /// ignored and the caller gets the most restrictive of the answers any program could
    /// get (see `Layer::grant`), so a rule restricting some program is never escaped by
    /// being unknown.
    pub program_unknown: bool,
}

impl Caller {
    /// A caller by ids alone (matching no program rule).
    pub const fn new(uid: u32, gid: u32) -> Caller {
        Caller {
            uid,
            gid,
            progs: 0,
            program_unknown: false,
        }
    }

    /// A caller by ids whose program is unknown (see [`Caller::program_unknown`]).
    pub const fn unknown_program(uid: u32, gid: u32) -> Caller {
        Caller {
            program_unknown: true,
            ..Caller::new(uid, gid)
        }
    }
}

/// What an operation needs on one path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Need {
    /// lookup, stat, readdir, readlink.
    List,
    /// open for read, getxattr/listxattr, execute.
    Read,
    /// mutation of an existing path (write, truncate, unlink, rmdir, rename source, chmod, …).
    Write,
    /// creating the path (create, mkdir, mknod, symlink, link target, a rename target that
    /// does not exist), or mutating a file this uid created through the mount and has not
    /// closed yet: needs `create` (or `write`); a `none` path is refused with EACCES
    /// instead of ENOENT.
    Create,
    /// opening an existing file for writing with O_APPEND (no O_TRUNC), and such writes:
    /// needs `append` (or `write`).
    Append,
}

impl Need {
    /// The access level that satisfies this need.
    pub fn access(self) -> Access {
        match self {
            Need::List => Access::List,
            Need::Read => Access::Read,
            Need::Create => Access::Create,
            Need::Append => Access::Append,
            Need::Write => Access::Write,
        }
    }

    /// A mutation: capped by the mode's ceiling (EROFS).
    pub fn mutates(self) -> bool {
        matches!(self, Need::Write | Need::Create | Need::Append)
    }

    /// The errno for a hidden path (`none`, a rule's or an ignore file's): ENOENT, as if
    /// it did not exist; EACCES for a create (ENOENT would tell the caller to make the
    /// parent, which exists).
    pub fn hidden_errno(self) -> i32 {
        match self {
            Need::Create => libc::EACCES,
            _ => libc::ENOENT,
        }
    }
}

/// What decided a path's access.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum By {
    /// The rule with this index (see [`Policy::rule`]).
    Rule(usize),
    /// No rule matched: the policy's `default`.
    Default,
    /// The mode ceiling lowered the grant (read-only, outside writable_roots, protected;
    /// [`Policy::ceiling_by`] says which), or a device/setid request was refused.
    Mode,
    /// The path's own grant is `none`, but the rule with this index grants `list` or more
    /// somewhere below it, so the directory stays visible as `list`.
    Visibility(usize),
    /// An ignore file (`ignore_files`) hides the path: which file, which line
    /// (see [`Policy::ignore_set`]).
    Ignore(IgnoreHit),
}

/// What sets the mode's ceiling at a path (see [`Policy::ceiling_by`]): the detail behind
/// [`By::Mode`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CeilingBy {
    /// No ceiling below `write`: mode danger, or workspace-write inside `writable_roots`
    /// and outside `protected`.
    Open,
    /// Mode read-only: no mutations anywhere.
    ReadOnly,
    /// workspace-write: the path lies outside every `writable_roots` entry.
    WritableRoots,
    /// workspace-write: the `protected` entry with this index covers the path (see
    /// [`Policy::protected_entry`]).
    Protected(usize),
}

/// A path's access for one caller, with provenance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Verdict {
    /// What the grants give (after the visibility lift), before the mode ceiling.
    pub grant: Access,
    /// min(grant, ceiling): what the caller actually gets.
    pub effective: Access,
    /// What decided `effective` (`By::Mode` when the ceiling is lower than the grant).
    pub by: By,
    /// The rule or default behind `grant` (never `By::Mode`).
    pub grant_by: By,
    /// The layer (index in [`Policy::layers`]) whose verdict this is: the one that
    /// decided, for a verdict of the whole set.
    pub layer: usize,
}

/// What kind of refusal a denial is. The variants are in the spec's order: when several
/// checks of one request refuse, the first kind decides (`Ord`); each kind has one errno
/// ([`Refusal::errno`]), so nothing reads the kind back from an errno.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Refusal {
    /// `none` (a rule's, the default's, an ignore file's): ENOENT, as if absent (EACCES
    /// for a create).
    Hidden,
    /// A device node or set-ID bit the policy does not allow: EPERM.
    Special,
    /// Above the mode's ceiling, or a change of a pinned policy file: EROFS.
    Mode,
    /// The grant of a rule or the default does not include the need: EACCES, the one
    /// kind an approver may lift ([`Denial::askable`]).
    Rule,
}

impl Refusal {
    /// Its errno for `need`.
    pub fn errno(self, need: Need) -> i32 {
        match self {
            Refusal::Hidden => need.hidden_errno(),
            Refusal::Special => libc::EPERM,
            Refusal::Mode => libc::EROFS,
            Refusal::Rule => libc::EACCES,
        }
    }
}

/// Why a request was refused: its [`Refusal`] kind and the errno that kind gives the need
/// (none → ENOENT (EACCES for `Need::Create`), device/setid → EPERM, mode → EROFS, rule →
/// EACCES), made together by [`Denial::new`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Denial {
    /// What kind of refusal.
    pub refusal: Refusal,
    /// libc errno value (`refusal.errno(need)`).
    pub errno: i32,
    /// The verdict of the refused path.
    pub verdict: Verdict,
    /// What refused (Rule/Default/Visibility for EACCES and ENOENT, Mode for EROFS).
    pub by: By,
}

impl Denial {
    /// A `refusal` of `need` with `verdict`, refused `by`.
    pub fn new(refusal: Refusal, need: Need, verdict: Verdict, by: By) -> Denial {
        Denial {
            refusal,
            errno: refusal.errno(need),
            verdict,
            by,
        }
    }

    /// The access an approver could grant for this refusal of `need`: only a refusal by
    /// a rule (not the mode, not `none`, not device/setid) whose `ask` covers what was
    /// needed.
    pub fn askable(&self, policy: &crate::policy::Policy, need: Need) -> Option<Access> {
        self.ask_of(need, |i| policy.rule(i).ask)
    }

    /// [`Denial::askable`] with `ask` giving rule `i`'s `ask` (the set's indices, or one
    /// layer's own).
    pub fn ask_of(&self, need: Need, ask: impl Fn(usize) -> Option<Access>) -> Option<Access> {
        let By::Rule(i) = self.by else { return None };
        if self.refusal != Refusal::Rule {
            return None;
        }
        ask(i).filter(|a| a.includes(need.access()))
    }
}

/// Special things a creating/chmod request asks for, refused with EPERM unless allowed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Special {
    /// A character or block device node.
    pub device: bool,
    /// The setuid or setgid bit.
    pub setid: bool,
}

/// One compiled rule, as written in the file.
#[derive(Clone, Debug)]
pub struct RuleInfo {
    /// The `path` as written.
    pub pattern: String,
    /// Its access.
    pub access: Access,
    /// `ask`: the higher access an approver may grant while the request waits.
    pub ask: Option<Access>,
    /// 1-based line of the `[[rule]]` header (0 for rules not from a file).
    pub line: usize,
    /// `except = [...]` as written (empty when absent): paths these globs match, and
    /// everything below them, are not covered by this rule.
    pub except: Vec<String>,
    /// The layer (index in [`Policy::layers`]) the rule comes from.
    pub layer: usize,
    /// The preset the rule comes from (`None`: written in the file); `line` is then the
    /// line of the `presets` entry naming it.
    pub preset: Option<&'static str>,
    /// `uid = [...]`, empty when absent.
    pub uids: Vec<u32>,
    /// `gid = [...]`, empty when absent.
    pub gids: Vec<u32>,
    /// `exec = false` (default true): files the rule covers cannot be executed.
    pub exec: bool,
    /// `exe = [...]` as written, empty when absent.
    pub exe: Vec<String>,
    /// `ancestor_exe = [...]` as written, empty when absent.
    pub ancestor_exe: Vec<String>,
}

/// A policy error with location: Display is `file:line:column: message`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyError {
    /// File name as given.
    pub file: String,
    /// 1-based line (0 when unknown, e.g. the file cannot be read).
    pub line: usize,
    /// 1-based column (0 when unknown).
    pub column: usize,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.file, self.message)
        } else {
            write!(
                f,
                "{}:{}:{}: {}",
                self.file, self.line, self.column, self.message
            )
        }
    }
}

mod ancestors;
pub(crate) mod build;
mod decide;
mod glob;
pub mod ignore;
mod lattice;
mod layers;
mod listing;
mod memo;
pub mod presets;
mod program_set;
mod programs;
mod raw;
pub mod schema;
#[cfg(test)]
mod tests;

pub use build::Layer;
pub use ignore::{IgnoreHit, IgnoreSet, IgnoreSource};
pub use layers::Policy;
pub use listing::Listing;
pub use programs::MAX_PROGRAM_RULES;

/// Reads and compiles a policy file (one layer); every error found (not just the first).
pub fn load(path: &Path) -> Result<Policy, Vec<PolicyError>> {
    Policy::load(path)
}

fn load_layer(path: &Path) -> Result<Layer, Vec<PolicyError>> {
    Layer::load(path)
}

/// Reads and compiles every layer; the errors of every layer that fails (each naming its
/// file), or the whole set.
pub fn load_all(paths: &[impl AsRef<Path>]) -> Result<Policy, Vec<PolicyError>> {
    Policy::load_all(paths)
}

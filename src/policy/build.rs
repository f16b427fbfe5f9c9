//! Building a [`Layer`]: the raw parse from `raw.rs` → the compiled policy, with every
//! validation error. PURE (reading the file in [`Layer::load`] is the only I/O).
//!
//! # File format
//!
//! ```toml
//! mode = "workspace-write"   # read-only | workspace-write | danger   (default read-only)
//! default = "write"          # none | list | read | write             (default write)
//! writable_roots = ["."]     # globs; "." is the whole workspace      (default ["."])
//! protected = [".git/hooks", ".git/config"]                          # (this is the default)
//! allow_setid = false
//! allow_devices = false
//!
//! [[rule]]
//! path = "secrets"           # glob, relative to the workspace root (required)
//! access = "none"            # none | list | read | create | append | write (required)
//! exec = false              # optional: covered files cannot be executed
//! except = ["secrets/pub"]   # optional globs: not covered by this rule
//! uid = [1000]               # optional, non-empty
//! gid = [100]                # optional, non-empty
//! ```
//!
//! Every path (rule `path` and `except`, `writable_roots`, `protected`) is normalized: a
//! leading `./`, a trailing `/`, empty and `.` components are dropped; `.` alone is the
//! workspace root. Empty paths, absolute paths, `..` components and invalid globs are
//! errors.
//!
//! Invariants: a [`Layer`] exists only fully compiled (every glob, every list); a
//! failed build returns every error found, sorted by position, each with a 1-based line
//! and column; the compiled form is immutable afterwards except the mode (`--mode`).
//! Nothing here decides a request (that is `decide.rs`).

use std::path::Path;

use globset::GlobSetBuilder;

use super::ancestors::PrefixSet;
use super::glob::{CompiledPattern, CoverSet, Pattern, compile_pattern};
use super::memo::MemoId;
use super::programs::ProgSel;
use super::raw::{self, Located, RawError};
use super::{Access, Mode, PolicyError, RuleInfo};

/// The `protected` list used when the file does not set one.
pub const DEFAULT_PROTECTED: &[&str] = &[".git/hooks", ".git/config"];

/// The name of the built-in policy (in errors; `explain`).
const BUILTIN: &str = "<built-in policy>";

/// The `writable_roots` list used when the file does not set one.
pub const DEFAULT_WRITABLE_ROOTS: &[&str] = &["."];

/// One compiled policy file (a layer; see `layers.rs` for the set). Cheap to query from many threads (`&self` only); compile once per
/// load/reload.
#[derive(Debug, Clone)]
pub struct Layer {
    /// The file this layer was read from, as given (`<built-in policy>` for the built-in one).
    pub(super) file: String,
    /// The file sets `mode` (a layer without it does not take part in the combined mode).
    pub(super) mode_set: bool,
    /// `workspace_policy`: the name of a file at SOURCE's root that is one more layer.
    pub(super) workspace_policy: Option<String>,
    /// `ignore_files`: names of gitignore-style files in SOURCE whose matches are hidden.
    pub(super) ignore_files: Vec<String>,
    pub(super) mode: Mode,
    pub(super) default: Access,
    pub(super) allow_setid: bool,
    pub(super) allow_devices: bool,
    /// `agent_notes` as written (`None`: the key is absent).
    pub(super) agent_notes: Option<bool>,
    pub(super) rules: Vec<RuleInfo>,
    /// Parallel to `rules`.
    pub(super) patterns: Vec<Pattern>,
    /// Parallel to `rules`: the rule has a `uid` or `gid` list, or a program selector
    /// (such a rule beats a plain one at the same depth).
    pub(super) has_ids: Vec<bool>,
    /// Parallel to `rules`: the rule's `exe` / `ancestor_exe` selector.
    pub(super) prog: Vec<Option<ProgSel>>,
    /// All rules except root-only ones (`.`), one `matches()` per depth.
    pub(super) set: PrefixSet,
    /// Glob index in `set` → rule index.
    pub(super) set_to_rule: Vec<usize>,
    /// Rules that match the root `b""`.
    pub(super) root_rules: Vec<usize>,
    /// Rules granting `list` or more (candidates for the visibility lift).
    pub(super) lift_rules: Vec<usize>,
    /// Parallel to `rules`: the component forms of the rule's `except` globs.
    pub(super) excepts: Vec<Vec<Pattern>>,
    /// Every `except` glob of every rule, except root-only ones (`.`).
    pub(super) except_set: PrefixSet,
    /// Glob index in `except_set` → (rule index, index in the rule's `except`).
    pub(super) except_to: Vec<(usize, usize)>,
    /// Rules with an `except` glob that matches the root: they cover nothing at all.
    pub(super) dead_rules: Vec<usize>,
    /// Rules with access `none` and an `except` list: below a directory they hide, what an
    /// except glob matches falls to other rules (see the visibility lift).
    pub(super) hole_rules: Vec<usize>,
    pub(super) has_id_rules: bool,
    /// Rules with `exec = false` (see `Layer::exec_denied`).
    pub(super) noexec_rules: Vec<usize>,
    /// `default` or some rule is `none` (see [`Layer::may_hide`]).
    pub(super) may_hide: bool,
    pub(super) writable_roots: Vec<String>,
    pub(super) protected: Vec<String>,
    /// Parallel to `protected`: the entry's line in the file (`None` for the default list).
    pub(super) protected_lines: Vec<Option<usize>>,
    pub(super) roots: CoverSet,
    pub(super) protect: CoverSet,
    /// This layer as the decision memo knows it (`memo.rs`): renewed on every change.
    pub(super) memo: MemoId,
    /// The layer's recent answers (`memo.rs`), shared by every thread deciding with it.
    pub(super) answers: super::memo::Shared,
}

fn parse_access(word: &str) -> Option<Access> {
    match word {
        "none" => Some(Access::None),
        "list" => Some(Access::List),
        "read" => Some(Access::Read),
        "create" => Some(Access::Create),
        "append" => Some(Access::Append),
        "write" => Some(Access::Write),
        _ => None,
    }
}

/// `ask` is `read`, `create`, `append` or `write`, strictly above the rule's `access` in
/// the lattice (so `ask = "append"` over `access = "create"` is an error: an approver
/// would take the right to create away), which is at least `list` (a hidden path cannot
/// be asked for).
fn check_ask(
    word: &Located<String>,
    access: Option<Access>,
    errors: &mut Vec<RawError>,
) -> Option<Access> {
    let err = |message: String| RawError {
        span: word.span.clone(),
        message,
    };
    let ask = match parse_access(&word.value) {
        Some(a) if a.includes(Access::Read) => a,
        _ => {
            errors.push(err(format!(
                "unknown ask \"{}\" (expected read, create, append or write)",
                word.value
            )));
            return None;
        }
    };
    match access {
        Some(Access::None) => {
            errors.push(err(
                "ask on an access = \"none\" rule: a hidden path cannot be asked for".into(),
            ));
            None
        }
        Some(a) if !ask.above(a) => {
            errors.push(err(format!(
                "ask = \"{ask}\" must be higher than access = \"{a}\" (create and append are not above each other)"
            )));
            None
        }
        _ => Some(ask),
    }
}

fn bad_access(word: &Located<String>, what: &str) -> RawError {
    RawError {
        span: word.span.clone(),
        message: format!(
            "unknown {what} \"{}\" (expected none, list, read, create, append or write)",
            word.value
        ),
    }
}

/// 1-based line and column (in characters) of byte `offset` in `src`.
pub(crate) fn line_col(src: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(src.len());
    while !src.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &src[..offset];
    let line = before.bytes().filter(|&b| b == b'\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}

fn to_policy_errors(src: &str, file: &str, mut errors: Vec<RawError>) -> Vec<PolicyError> {
    errors.sort_by_key(|e| e.span.start);
    errors
        .into_iter()
        .map(|e| {
            let (line, column) = line_col(src, e.span.start);
            PolicyError {
                file: file.to_string(),
                line,
                column,
                message: e.message,
            }
        })
        .collect()
}

/// Compiles a list of located pattern strings, recording errors.
fn compile_list(
    items: &[Located<String>],
    what: &str,
    errors: &mut Vec<RawError>,
) -> Vec<CompiledPattern> {
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        match compile_pattern(&item.value, what) {
            Ok(c) => out.push(c),
            Err(message) => errors.push(RawError {
                span: item.span.clone(),
                message,
            }),
        }
    }
    out
}

fn defaults(list: &[&str], what: &str) -> Vec<CompiledPattern> {
    // Constants, known to compile (tested); an impossible failure just drops the entry.
    list.iter()
        .filter_map(|s| compile_pattern(s, what).ok())
        .collect()
}

/// `ignore_files` entries: each one file name (no `/`, not `.`/`..`), duplicates dropped.
fn ignore_names(items: &[Located<String>], errors: &mut Vec<RawError>) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(items.len());
    for item in items {
        let v = &item.value;
        if v.is_empty() || v == "." || v == ".." || v.contains('/') || v.contains('\0') {
            errors.push(RawError {
                span: item.span.clone(),
                message: format!(
                    "ignore_files entry \"{v}\" must be a file name (e.g. \".aiignore\"), found anywhere in SOURCE"
                ),
            });
        } else if !out.contains(v) {
            out.push(v.clone());
        }
    }
    out
}

impl Layer {
    /// Reads and compiles a policy file. A read error is one error with line 0; otherwise
    /// see [`Layer::parse`] (with `file` = `path.display()`).
    pub fn load(path: &Path) -> Result<Layer, Vec<PolicyError>> {
        let file = path.display().to_string();
        match std::fs::read_to_string(path) {
            Ok(src) => Layer::parse(&src, &file),
            Err(e) => Err(vec![PolicyError {
                file,
                line: 0,
                column: 0,
                message: format!("cannot read policy file: {e}"),
            }]),
        }
    }

    /// Parses and compiles policy text. On failure returns every error found (a TOML
    /// syntax error stops parsing, so it comes alone), sorted by position, each with a
    /// 1-based line and column pointing at the offending key or value (or at the
    /// `[[rule]]` header for a missing key).
    pub fn parse(src: &str, file: &str) -> Result<Layer, Vec<PolicyError>> {
        let (raw, mut errors) = match raw::parse(src) {
            Ok(parsed) => parsed,
            Err(e) => return Err(to_policy_errors(src, file, vec![e])),
        };

        let mode = match &raw.mode {
            None => Mode::ReadOnly,
            Some(word) => word.value.parse::<Mode>().unwrap_or_else(|_| {
                errors.push(RawError {
                    span: word.span.clone(),
                    message: format!(
                        "unknown mode \"{}\" (expected read-only, workspace-write or danger)",
                        word.value
                    ),
                });
                Mode::ReadOnly
            }),
        };
        let default = match &raw.default {
            None => Access::Write,
            Some(word) => parse_access(&word.value).unwrap_or_else(|| {
                errors.push(bad_access(word, "default access"));
                Access::Write
            }),
        };

        let writable_roots: Vec<String> = match &raw.writable_roots {
            None => DEFAULT_WRITABLE_ROOTS
                .iter()
                .map(|s| s.to_string())
                .collect(),
            Some(items) => items.iter().map(|l| l.value.clone()).collect(),
        };
        let roots = match &raw.writable_roots {
            None => defaults(DEFAULT_WRITABLE_ROOTS, "writable_roots entry"),
            Some(items) => compile_list(items, "writable_roots entry", &mut errors),
        };
        let protected: Vec<String> = match &raw.protected {
            None => DEFAULT_PROTECTED.iter().map(|s| s.to_string()).collect(),
            Some(items) => items.iter().map(|l| l.value.clone()).collect(),
        };
        let protect = match &raw.protected {
            None => defaults(DEFAULT_PROTECTED, "protected entry"),
            Some(items) => compile_list(items, "protected entry", &mut errors),
        };
        let protected_lines: Vec<Option<usize>> = match &raw.protected {
            None => vec![None; protected.len()],
            Some(items) => items
                .iter()
                .map(|l| Some(line_col(src, l.span.start).0))
                .collect(),
        };

        let mut rules = Vec::with_capacity(raw.rules.len());
        let mut progs = Vec::with_capacity(raw.rules.len());
        let mut compiled = Vec::with_capacity(raw.rules.len());
        let mut excepts = Vec::with_capacity(raw.rules.len());
        for r in &raw.rules {
            let except = r.except.as_deref().unwrap_or_default();
            let except_compiled = compile_list(except, "except entry", &mut errors);
            let pattern = r.path.as_ref().and_then(|p| {
                compile_pattern(&p.value, "rule path")
                    .map_err(|message| {
                        errors.push(RawError {
                            span: p.span.clone(),
                            message,
                        })
                    })
                    .ok()
            });
            let access = r.access.as_ref().and_then(|a| {
                let access = parse_access(&a.value);
                if access.is_none() {
                    errors.push(bad_access(a, "access"));
                }
                access
            });
            let ask = r
                .ask
                .as_ref()
                .and_then(|a| check_ask(a, access, &mut errors));
            let prog = ProgSel::compile(
                r.exe.as_deref(),
                r.ancestor_exe.as_deref(),
                &r.header,
                &mut errors,
            );
            if let (Some(path), Some(pattern), Some(access)) = (&r.path, pattern, access) {
                rules.push(RuleInfo {
                    pattern: path.value.clone(),
                    access,
                    ask,
                    line: line_col(src, r.header.start).0,
                    except: except.iter().map(|l| l.value.clone()).collect(),
                    layer: 0,
                    preset: None,
                    uids: r.uid.clone().unwrap_or_default(),
                    gids: r.gid.clone().unwrap_or_default(),
                    exec: r.exec.unwrap_or(true),
                    exe: r.exe.iter().flatten().map(|l| l.value.clone()).collect(),
                    ancestor_exe: (r.ancestor_exe.iter().flatten())
                        .map(|l| l.value.clone())
                        .collect(),
                });
                progs.push(prog);
                compiled.push(pattern);
                excepts.push(except_compiled);
            }
        }

        let workspace_policy = raw.workspace_policy.as_ref().and_then(|w| {
            let v = &w.value;
            let ok = !v.is_empty() && v != "." && v != ".." && !v.contains('/') && !v.contains('\0');
            if !ok {
                errors.push(RawError {
                    span: w.span.clone(),
                    message: format!(
                        "workspace_policy \"{v}\" must be one file name at the workspace root (e.g. \".fencefs.toml\")"
                    ),
                });
            }
            ok.then(|| v.clone())
        });
        let ignore_files =
            ignore_names(raw.ignore_files.as_deref().unwrap_or_default(), &mut errors);
        for entry in raw.presets.iter().flatten() {
            let Some(preset) = super::presets::find(&entry.value) else {
                let names: Vec<&str> = super::presets::PRESETS.iter().map(|p| p.name).collect();
                errors.push(RawError {
                    span: entry.span.clone(),
                    message: format!(
                        "unknown preset \"{}\" (expected one of: {})",
                        entry.value,
                        names.join(", ")
                    ),
                });
                continue;
            };
            let line = line_col(src, entry.span.start).0;
            for r in preset.rules {
                // Constants, known to compile (tests/presets); a failure drops the rule
                // and is an error, never a silently weaker policy.
                let (Ok(pattern), Ok(except)) = (
                    compile_pattern(r.path, "rule path"),
                    r.except
                        .iter()
                        .map(|e| compile_pattern(e, "except entry"))
                        .collect::<Result<Vec<_>, _>>(),
                ) else {
                    errors.push(RawError {
                        span: entry.span.clone(),
                        message: format!("preset \"{}\" does not compile", preset.name),
                    });
                    continue;
                };
                rules.push(RuleInfo {
                    pattern: r.path.to_string(),
                    access: r.access,
                    ask: None,
                    line,
                    except: r.except.iter().map(|e| e.to_string()).collect(),
                    layer: 0,
                    preset: Some(preset.name),
                    uids: Vec::new(),
                    gids: Vec::new(),
                    exec: true,
                    exe: Vec::new(),
                    ancestor_exe: Vec::new(),
                });
                progs.push(None);
                compiled.push(pattern);
                excepts.push(except);
            }
        }

        if !errors.is_empty() {
            return Err(to_policy_errors(src, file, errors));
        }
        let mut policy = Layer::build(
            mode,
            default,
            (rules, compiled, excepts),
            (writable_roots, roots),
            (protected, protect, protected_lines),
        )
        .map_err(|e| {
            to_policy_errors(
                src,
                file,
                vec![RawError {
                    span: 0..0,
                    message: format!("the policy's globs are too complex to compile: {e}"),
                }],
            )
        })?;
        policy.file = file.to_string();
        policy.mode_set = raw.mode.is_some();
        policy.workspace_policy = workspace_policy;
        policy.ignore_files = ignore_files;
        policy.allow_setid = raw.allow_setid.unwrap_or(false);
        policy.allow_devices = raw.allow_devices.unwrap_or(false);
        policy.agent_notes = raw.agent_notes;
        for (i, p) in progs.iter().enumerate() {
            policy.has_ids[i] |= p.is_some();
        }
        policy.has_id_rules |= progs.iter().any(Option::is_some);
        policy.prog = progs;
        policy.memo = MemoId::fresh();
        Ok(policy)
    }

    fn build(
        mode: Mode,
        default: Access,
        (rules, compiled, except_compiled): (
            Vec<RuleInfo>,
            Vec<CompiledPattern>,
            Vec<Vec<CompiledPattern>>,
        ),
        (writable_roots, roots): (Vec<String>, Vec<CompiledPattern>),
        (protected, protect, protected_lines): (
            Vec<String>,
            Vec<CompiledPattern>,
            Vec<Option<usize>>,
        ),
    ) -> Result<Layer, globset::Error> {
        let mut builder = GlobSetBuilder::new();
        let mut set_to_rule = Vec::new();
        let mut root_rules = Vec::new();
        let mut patterns = Vec::with_capacity(compiled.len());
        for (idx, c) in compiled.into_iter().enumerate() {
            if let Some(glob) = c.glob {
                builder.add(glob);
                set_to_rule.push(idx);
            }
            if c.pattern.root {
                root_rules.push(idx);
            }
            patterns.push(c.pattern);
        }
        let has_ids: Vec<bool> = rules
            .iter()
            .map(|r| !r.uids.is_empty() || !r.gids.is_empty())
            .collect();
        let mut except_builder = GlobSetBuilder::new();
        let mut except_to = Vec::new();
        let mut dead_rules = Vec::new();
        let mut excepts = Vec::with_capacity(except_compiled.len());
        for (rule, list) in except_compiled.into_iter().enumerate() {
            let mut patterns = Vec::with_capacity(list.len());
            for (k, c) in list.into_iter().enumerate() {
                if let Some(glob) = c.glob {
                    except_builder.add(glob);
                    except_to.push((rule, k));
                }
                if c.pattern.root && dead_rules.last() != Some(&rule) {
                    dead_rules.push(rule);
                }
                patterns.push(c.pattern);
            }
            excepts.push(patterns);
        }
        let lift_rules = (0..rules.len())
            .filter(|&i| rules[i].access.includes(Access::List))
            .collect();
        let noexec_rules = (0..rules.len()).filter(|&i| !rules[i].exec).collect();
        let hole_rules = (0..rules.len())
            .filter(|&i| rules[i].access == Access::None && !excepts[i].is_empty())
            .collect();
        // A rule that an except glob takes out at the root covers nothing, so it hides
        // nothing either.
        let may_hide = default == Access::None
            || (0..rules.len())
                .any(|i| rules[i].access == Access::None && dead_rules.binary_search(&i).is_err());
        Ok(Layer {
            file: String::new(),
            mode_set: false,
            workspace_policy: None,
            ignore_files: Vec::new(),
            mode,
            default,
            may_hide,
            excepts,
            except_set: PrefixSet::new(except_builder.build()?),
            except_to,
            dead_rules,
            hole_rules,
            protected_lines,
            allow_setid: false,
            allow_devices: false,
            agent_notes: None,
            has_id_rules: has_ids.iter().any(|&b| b),
            prog: vec![None; has_ids.len()],
            noexec_rules,
            has_ids,
            patterns,
            set: PrefixSet::new(builder.build()?),
            set_to_rule,
            root_rules,
            lift_rules,
            rules,
            writable_roots,
            protected,
            roots: CoverSet::build(roots)?,
            protect: CoverSet::build(protect)?,
            memo: MemoId::fresh(),
            answers: Default::default(),
        })
    }

    /// The policy used without `--policy`: mode read-only, default `read`, no rules,
    /// every other setting at its default.
    pub fn builtin_default() -> Layer {
        // A constant, not user data; `tests::builtin_default_policy` proves it compiles.
        Layer::parse("mode = \"read-only\"\ndefault = \"read\"\n", BUILTIN)
            .expect("the built-in policy compiles")
    }

    /// The file this layer was read from, as given.
    pub fn file(&self) -> &str {
        &self.file
    }

    /// `workspace_policy = NAME` as written (one file name at SOURCE's root).
    pub fn workspace_policy(&self) -> Option<&str> {
        self.workspace_policy.as_deref()
    }

    /// `ignore_files` as written (file names, each at most once).
    pub fn ignore_files(&self) -> &[String] {
        &self.ignore_files
    }

    /// Whether this layer was read from a file (not the built-in policy).
    pub fn from_file(&self) -> bool {
        self.file != BUILTIN
    }

    /// Overrides the mode (the CLI's `--mode`).
    pub fn set_mode(&mut self, mode: Mode) {
        self.mode = mode;
        // `Policy::from_layers` changes program bits, then sets every layer's mode.
        self.memo = MemoId::fresh();
    }

    /// The mode in force.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The access of paths no rule matches.
    pub fn default_access(&self) -> Access {
        self.default
    }

    /// The rules, in file order; [`By::Rule`](super::By::Rule) and [`By::Visibility`](super::By::Visibility) index into this.
    pub fn rules(&self) -> &[RuleInfo] {
        &self.rules
    }

    /// Rule `idx` (as found in [`By::Rule`](super::By::Rule) / [`By::Visibility`](super::By::Visibility)). Panics when out of range,
    /// like slice indexing: only pass indices this policy produced.
    pub fn rule(&self, idx: usize) -> &RuleInfo {
        &self.rules[idx]
    }

    /// Some rule has a `uid` or `gid` list or a program selector (answers may differ
    /// between callers).
    pub fn has_id_rules(&self) -> bool {
        self.has_id_rules
    }

    /// Whether some path could be hidden from some caller: `default` is `none`, or some
    /// rule — whatever its `uid`/`gid` or the visibility lift — has access `none`.
    /// When false, every caller sees every host entry (listings, link counts are exact).
    pub fn may_hide(&self) -> bool {
        self.may_hide
    }

    /// `allow_setid = true`.
    pub fn allow_setid(&self) -> bool {
        self.allow_setid
    }

    /// `allow_devices = true`.
    pub fn allow_devices(&self) -> bool {
        self.allow_devices
    }

    /// `agent_notes` as written (`None` when absent).
    pub fn agent_notes(&self) -> Option<bool> {
        self.agent_notes
    }

    /// `writable_roots` as written (`["."]` when absent).
    pub fn writable_roots(&self) -> &[String] {
        &self.writable_roots
    }

    /// `protected` as written (`[".git/hooks", ".git/config"]` when absent).
    pub fn protected(&self) -> &[String] {
        &self.protected
    }
}

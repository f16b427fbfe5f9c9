//! Structural layer of the policy file: TOML text → [`RawPolicy`], with byte spans.
//!
//! This layer checks the TOML syntax, the key names and the value *types*; the meaning of
//! the values (access and mode words, paths, globs) is checked in `compile.rs`.
//!
//! It walks toml's own spanned document tree ([`toml::de::DeTable`], the layer that serde
//! deserialization sits on) instead of deriving `Deserialize` with
//! `#[serde(deny_unknown_fields)]`: serde stops at the first unknown key or wrong type,
//! whereas the contract is to report *every* error, each with its line and column. The
//! spans are those of [`toml::Spanned`], so keys and values are located exactly.
//!
//! Grammar (every key optional unless noted; any other key is an error):
//!
//! ```text
//! top level   mode           = string
//!             default        = string
//!             writable_roots = [string, ...]
//!             protected      = [string, ...]
//!             allow_setid    = boolean
//!             allow_devices  = boolean
//!             agent_notes    = boolean
//!             presets        = [string, ...]
//!             workspace_policy = string
//!             ignore_files   = [string, ...]
//!             rule           = array of tables ([[rule]])
//! [[rule]]    path   = string                  (required)
//!             access = string                  (required)
//!             except = [string, ...]           (globs; may be empty)
//!             uid    = [integer 0..=u32::MAX, ...]  (non-empty)
//!             gid    = [integer 0..=u32::MAX, ...]  (non-empty)
//!             exec   = boolean                 (false: covered files cannot be executed)
//!             exe    = [string, ...]           (absolute program globs; non-empty)
//!             ancestor_exe = [string, ...]     (absolute program globs; non-empty)
//! ```

use std::ops::Range;

use toml::Spanned;
use toml::de::{DeTable, DeValue};

/// A value with the byte span it came from.
#[derive(Clone, Debug)]
pub(crate) struct Located<T> {
    pub value: T,
    pub span: Range<usize>,
}

/// A structural error at a byte span.
#[derive(Clone, Debug)]
pub(crate) struct RawError {
    pub span: Range<usize>,
    pub message: String,
}

/// One `[[rule]]` table.
#[derive(Clone, Debug, Default)]
pub(crate) struct RawRule {
    /// Span of the `[[rule]]` header (or of the inline table).
    pub header: Range<usize>,
    pub path: Option<Located<String>>,
    pub access: Option<Located<String>>,
    pub ask: Option<Located<String>>,
    /// `except = [...]`: globs whose matches (and what lies below them) the rule does not
    /// cover.
    pub except: Option<Vec<Located<String>>>,
    pub uid: Option<Vec<u32>>,
    pub gid: Option<Vec<u32>>,
    /// `exec = false`: covered files cannot be executed.
    pub exec: Option<bool>,
    /// `exe = [...]`: only for requests from processes running one of these programs.
    pub exe: Option<Vec<Located<String>>>,
    /// `ancestor_exe = [...]`: only for processes with one of these among themselves and
    /// their ancestors.
    pub ancestor_exe: Option<Vec<Located<String>>>,
}

/// The policy file as written, types checked, meanings not yet.
#[derive(Clone, Debug, Default)]
pub(crate) struct RawPolicy {
    pub mode: Option<Located<String>>,
    pub default: Option<Located<String>>,
    pub writable_roots: Option<Vec<Located<String>>>,
    pub protected: Option<Vec<Located<String>>>,
    pub allow_setid: Option<bool>,
    pub allow_devices: Option<bool>,
    /// `agent_notes = true`: the virtual `.fencefs/` directory (see `fs/notes/`).
    pub agent_notes: Option<bool>,
    /// `presets = [...]`: built-in rule sets (see `presets.rs`).
    pub presets: Option<Vec<Located<String>>>,
    /// `workspace_policy = NAME`: a layer inside SOURCE (see `layers.rs`).
    pub workspace_policy: Option<Located<String>>,
    /// `ignore_files = [NAME, ...]`: gitignore-style files in SOURCE (see `ignore.rs`).
    pub ignore_files: Option<Vec<Located<String>>>,
    pub rules: Vec<RawRule>,
}

pub(crate) const TOP_KEYS: &str = "mode, default, writable_roots, protected, allow_setid, allow_devices, agent_notes, presets, workspace_policy, ignore_files, rule";
pub(crate) const RULE_KEYS: &str = "path, access, ask, except, uid, gid, exec, exe, ancestor_exe";

/// Parses `src`. `Err` is a TOML syntax error (the parser stops at the first one);
/// otherwise the raw policy plus every structural error found (possibly none).
pub(crate) fn parse(src: &str) -> Result<(RawPolicy, Vec<RawError>), RawError> {
    let doc = DeTable::parse(src).map_err(|e| RawError {
        span: e.span().unwrap_or(0..0),
        message: format!("TOML syntax error: {}", e.message().trim_end()),
    })?;
    let mut errors = Vec::new();
    let mut raw = RawPolicy::default();
    for (key, value) in doc.get_ref().iter() {
        let name: &str = key.get_ref();
        match name {
            "mode" => raw.mode = string(name, value, &mut errors),
            "default" => raw.default = string(name, value, &mut errors),
            "writable_roots" => raw.writable_roots = strings(name, value, &mut errors),
            "protected" => raw.protected = strings(name, value, &mut errors),
            "allow_setid" => raw.allow_setid = boolean(name, value, &mut errors),
            "allow_devices" => raw.allow_devices = boolean(name, value, &mut errors),
            "agent_notes" => raw.agent_notes = boolean(name, value, &mut errors),
            "presets" => raw.presets = strings(name, value, &mut errors),
            "workspace_policy" => raw.workspace_policy = string(name, value, &mut errors),
            "ignore_files" => raw.ignore_files = strings(name, value, &mut errors),
            "rule" => raw.rules = rules(value, &mut errors),
            _ => errors.push(unknown_key(key, TOP_KEYS)),
        }
    }
    Ok((raw, errors))
}

fn unknown_key(key: &Spanned<std::borrow::Cow<'_, str>>, expected: &str) -> RawError {
    RawError {
        span: key.span(),
        message: format!(
            "unknown key \"{}\" (expected one of: {expected})",
            key.get_ref()
        ),
    }
}

fn type_error(what: &str, expected: &str, value: &Spanned<DeValue<'_>>) -> RawError {
    RawError {
        span: value.span(),
        message: format!(
            "{what} must be {expected}, found {}",
            value.get_ref().type_str()
        ),
    }
}

fn string(
    name: &str,
    value: &Spanned<DeValue<'_>>,
    errors: &mut Vec<RawError>,
) -> Option<Located<String>> {
    match value.get_ref() {
        DeValue::String(s) => Some(Located {
            value: s.to_string(),
            span: value.span(),
        }),
        _ => {
            errors.push(type_error(&format!("\"{name}\""), "a string", value));
            None
        }
    }
}

fn boolean(name: &str, value: &Spanned<DeValue<'_>>, errors: &mut Vec<RawError>) -> Option<bool> {
    match value.get_ref() {
        DeValue::Boolean(b) => Some(*b),
        _ => {
            errors.push(type_error(
                &format!("\"{name}\""),
                "a boolean (true or false)",
                value,
            ));
            None
        }
    }
}

fn strings(
    name: &str,
    value: &Spanned<DeValue<'_>>,
    errors: &mut Vec<RawError>,
) -> Option<Vec<Located<String>>> {
    let DeValue::Array(items) = value.get_ref() else {
        errors.push(type_error(
            &format!("\"{name}\""),
            "an array of strings",
            value,
        ));
        return None;
    };
    let mut out = Vec::with_capacity(items.len());
    let mut ok = true;
    for item in items.iter() {
        match item.get_ref() {
            DeValue::String(s) => out.push(Located {
                value: s.to_string(),
                span: item.span(),
            }),
            _ => {
                ok = false;
                errors.push(type_error(
                    &format!("an element of \"{name}\""),
                    "a string",
                    item,
                ));
            }
        }
    }
    ok.then_some(out)
}

fn ids(name: &str, value: &Spanned<DeValue<'_>>, errors: &mut Vec<RawError>) -> Option<Vec<u32>> {
    let DeValue::Array(items) = value.get_ref() else {
        errors.push(type_error(
            &format!("\"{name}\""),
            "an array of integers",
            value,
        ));
        return None;
    };
    if items.is_empty() {
        errors.push(RawError {
            span: value.span(),
            message: format!(
                "\"{name}\" must not be empty (an empty list would match nobody; \
                 remove the key to apply the rule to everybody)"
            ),
        });
        return None;
    }
    let mut out = Vec::with_capacity(items.len());
    let mut ok = true;
    for item in items.iter() {
        match item.get_ref() {
            DeValue::Integer(i) => match u32::from_str_radix(i.as_str(), i.radix()) {
                Ok(n) => out.push(n),
                Err(_) => {
                    ok = false;
                    errors.push(RawError {
                        span: item.span(),
                        message: format!("{name} {i} is out of range (expected 0 to {})", u32::MAX),
                    });
                }
            },
            _ => {
                ok = false;
                errors.push(type_error(
                    &format!("an element of \"{name}\""),
                    "an integer",
                    item,
                ));
            }
        }
    }
    ok.then_some(out)
}

fn rules(value: &Spanned<DeValue<'_>>, errors: &mut Vec<RawError>) -> Vec<RawRule> {
    let DeValue::Array(items) = value.get_ref() else {
        errors.push(type_error(
            "\"rule\"",
            "an array of tables ([[rule]])",
            value,
        ));
        return Vec::new();
    };
    let mut out = Vec::with_capacity(items.len());
    for item in items.iter() {
        let DeValue::Table(table) = item.get_ref() else {
            errors.push(type_error("a rule", "a table", item));
            continue;
        };
        out.push(rule(item.span(), table, errors));
    }
    out
}

fn rule(header: Range<usize>, table: &DeTable<'_>, errors: &mut Vec<RawError>) -> RawRule {
    let mut r = RawRule {
        header,
        ..RawRule::default()
    };
    let (mut has_path, mut has_access) = (false, false);
    for (key, value) in table.iter() {
        let name: &str = key.get_ref();
        match name {
            "path" => {
                has_path = true;
                r.path = string(name, value, errors);
            }
            "access" => {
                has_access = true;
                r.access = string(name, value, errors);
            }
            "ask" => r.ask = string(name, value, errors),
            "except" => r.except = strings(name, value, errors),
            "uid" => r.uid = ids(name, value, errors),
            "gid" => r.gid = ids(name, value, errors),
            "exec" => r.exec = boolean(name, value, errors),
            "exe" => r.exe = strings(name, value, errors),
            "ancestor_exe" => r.ancestor_exe = strings(name, value, errors),
            _ => errors.push(unknown_key(key, RULE_KEYS)),
        }
    }
    // "Missing" only when the key is absent: a key present with a wrong type already has
    // its own error.
    if !has_path {
        errors.push(RawError {
            span: r.header.clone(),
            message: "rule is missing \"path\"".to_string(),
        });
    }
    if !has_access {
        errors.push(RawError {
            span: r.header.clone(),
            message: "rule is missing \"access\" (none, list, read, create, append or write)"
                .to_string(),
        });
    }
    r
}

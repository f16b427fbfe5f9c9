//! The policy file's JSON Schema (`fencefs schema`), generated with `schemars` from the
//! serde types below, for editors (taplo, VS Code "Even Better TOML") to validate and
//! complete policy files. PURE.
//!
//! These types describe the file's *shape* only; the policy is still parsed by `raw.rs`
//! (every error with its position) and built by `build.rs`. Invariants (tests/schema.rs):
//! the schema's keys are exactly `raw.rs`'s (`TOP_KEYS`, `RULE_KEYS`), its preset names
//! are [`super::presets::PRESETS`]', every policy the parser accepts validates, and a key
//! the parser rejects as unknown is rejected here too (`additionalProperties: false`, as
//! serde's `deny_unknown_fields`). Draft-07, which every editor's validator reads.

use schemars::{JsonSchema, Schema, SchemaGenerator, generate::SchemaSettings, json_schema};
use serde::Deserialize;

/// A fencefs policy file (one layer). See fencefs-policy(5).
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "fencefs policy")]
pub struct PolicyFile {
    /// The sandbox mode: a ceiling over the grants (read-only when absent). With several
    /// layers the most restrictive wins.
    pub mode: Option<ModeWord>,
    /// The access of paths no rule matches (write when absent).
    pub default: Option<AccessWord>,
    /// workspace-write: the globs where mutations are allowed ("." is the whole workspace).
    pub writable_roots: Option<Vec<String>>,
    /// workspace-write: globs kept read-only inside writable_roots.
    pub protected: Option<Vec<String>>,
    /// Allow setting the setuid/setgid bits (EPERM otherwise).
    pub allow_setid: Option<bool>,
    /// Allow creating device nodes (EPERM otherwise).
    pub allow_devices: Option<bool>,
    /// Show the agent a virtual, read-only `.fencefs/` directory at the mount's root: what
    /// the policy lets it do and why its last requests were refused.
    pub agent_notes: Option<bool>,
    /// Built-in rule sets (`fencefs presets` prints them).
    #[serde(default)]
    #[schemars(schema_with = "preset_names")]
    pub presets: Vec<String>,
    /// A file at SOURCE's root that is one more layer (e.g. ".fencefs.toml"); read-only
    /// to callers.
    pub workspace_policy: Option<String>,
    /// Names of gitignore-style files (e.g. ".aiignore"), wherever they stand in SOURCE:
    /// every path they match gets access none; they are read-only to callers.
    pub ignore_files: Option<Vec<String>>,
    /// The rules: the deepest matching path wins.
    pub rule: Option<Vec<Rule>>,
}

/// One `[[rule]]`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// A glob relative to the workspace root; covers what lies below it too.
    pub path: String,
    /// The access it grants.
    pub access: AccessWord,
    /// The higher access an approver may grant while the request waits.
    pub ask: Option<AskWord>,
    /// Globs this rule does not cover (nor what lies below them).
    pub except: Option<Vec<String>>,
    /// The rule applies only to these uids.
    #[schemars(length(min = 1))]
    pub uid: Option<Vec<u32>>,
    /// The rule applies only to these gids.
    #[schemars(length(min = 1))]
    pub gid: Option<Vec<u32>>,
    /// false: files the rule covers cannot be executed (execute bits read as cleared).
    pub exec: Option<bool>,
    /// The rule applies only to processes running one of these programs (absolute globs,
    /// as the process sees them).
    #[schemars(length(min = 1))]
    pub exe: Option<Vec<String>>,
    /// The rule applies when the process or an ancestor runs one of these programs.
    #[schemars(length(min = 1))]
    pub ancestor_exe: Option<Vec<String>>,
}

/// Sandbox modes.
#[derive(Deserialize, JsonSchema)]
pub enum ModeWord {
    /// No mutations anywhere.
    #[serde(rename = "read-only")]
    ReadOnly,
    /// Mutations inside writable_roots, outside protected.
    #[serde(rename = "workspace-write")]
    WorkspaceWrite,
    /// Mutations wherever the grants allow.
    #[serde(rename = "danger")]
    Danger,
}

/// Access levels: none < list < read < {create, append} < write.
#[derive(Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AccessWord {
    /// The path does not exist for the caller.
    None,
    /// lookup, stat, list a directory, readlink.
    List,
    /// Open and read contents, execute.
    Read,
    /// Read, plus creating new entries and writing a new file until its first close.
    Create,
    /// Read, plus writes with O_APPEND to existing files.
    Append,
    /// Every mutation.
    Write,
}

/// What an approver may grant.
#[derive(Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AskWord {
    /// Reading.
    Read,
    /// Creating new entries.
    Create,
    /// Appending.
    Append,
    /// Every mutation.
    Write,
}

fn preset_names(_: &mut SchemaGenerator) -> Schema {
    let names: Vec<&str> = super::presets::PRESETS.iter().map(|p| p.name).collect();
    json_schema!({
        "type": "array",
        "items": { "type": "string", "enum": names }
    })
}

/// The schema as pretty-printed JSON (what `fencefs schema` prints and the package ships).
pub fn json() -> String {
    let schema = SchemaSettings::draft07()
        .into_generator()
        .into_root_schema_for::<PolicyFile>();
    let mut value = schema.to_value();
    no_null(&mut value);
    let mut s = serde_json::to_string_pretty(&value).unwrap_or_default();
    s.push('\n');
    s
}

/// TOML has no null (a key is left out instead): drops the `null` that `Option` fields
/// get (`"type": [T, "null"]`, `"anyOf": [S, {"type": "null"}]`).
fn no_null(v: &mut serde_json::Value) {
    use serde_json::Value;
    let Value::Object(map) = v else {
        if let Value::Array(items) = v {
            items.iter_mut().for_each(no_null);
        }
        return;
    };
    if let Some(Value::Array(types)) = map.get_mut("type") {
        types.retain(|t| t != "null");
        if types.len() == 1 {
            let t = types.remove(0);
            map.insert("type".into(), t);
        }
    }
    if let Some(Value::Array(any)) = map.get("anyOf") {
        let rest: Vec<Value> = any
            .iter()
            .filter(|s| s.get("type").and_then(Value::as_str) != Some("null"))
            .cloned()
            .collect();
        if let [only] = rest.as_slice()
            && let Value::Object(inner) = only
        {
            map.remove("anyOf");
            for (k, val) in inner {
                map.entry(k.clone()).or_insert_with(|| val.clone());
            }
        }
    }
    map.values_mut().for_each(no_null);
}

/// The top-level and `[[rule]]` keys the parser accepts (for the drift test).
pub fn parser_keys() -> (Vec<&'static str>, Vec<&'static str>) {
    let split = |s: &'static str| s.split(", ").collect();
    (split(super::raw::TOP_KEYS), split(super::raw::RULE_KEYS))
}

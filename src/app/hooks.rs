//! `fencefs hooks print|install AGENT` and `fencefs checkpoint-hook`: a checkpoint sealed
//! per turn, from the agent's own hook configuration (SPEC "Per-turn checkpoints").
//!
//! What each agent documents, and what is relied on (docs/src/hooks.md says the same):
//! - Claude Code: `~/.claude/settings.json` (`$CLAUDE_CONFIG_DIR/settings.json`),
//!   `hooks.UserPromptSubmit: [{"hooks":[{"type":"command","command":…}]}]`; the command
//!   gets the event as JSON on stdin with a `prompt` field; its stdout on exit 0 is added
//!   to the model's context, so it prints nothing there.
//! - Codex CLI: `~/.codex/hooks.json` (`$CODEX_HOME/hooks.json`), the same shape and the
//!   same `UserPromptSubmit` event with `prompt` on stdin; older releases need
//!   `[features] codex_hooks = true` in `config.toml` (said, not written).
//! - Gemini CLI: `~/.gemini/settings.json`, `hooks.BeforeAgent` (after the prompt is
//!   submitted, before planning) in the same shape, `prompt` on stdin; stdout must be JSON
//!   only, so the hook prints `{}`.
//!
//! Invariants: `print` only prints. `install` keeps every other key of the settings file
//! (a file that is not a JSON object is refused, untouched), writes a backup of the file
//! as it was beside it first, replaces the file whole (written beside, synced, renamed)
//! and is idempotent (an earlier fencefs hook in that event is replaced, not doubled).
//! The hook never makes the agent fail: it exits 0 whatever happens, saying on stderr
//! why no checkpoint was sealed; without `$FENCEFS_CHECKPOINT` (not fenced) it does
//! nothing.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use crate::cli::{HookAgent, HooksArgs};
use crate::control::checkpoint;

/// The hook's stdin is read up to this many bytes (a prompt may be long; the message
/// needs its first line only).
const MAX_STDIN: u64 = 8 << 20;
/// What marks a hook group as ours (for an idempotent install).
const MARK: &str = "checkpoint-hook";

impl HookAgent {
    fn name(self) -> &'static str {
        match self {
            HookAgent::ClaudeCode => "claude-code",
            HookAgent::Codex => "codex",
            HookAgent::Gemini => "gemini",
        }
    }

    /// The event the hook goes under.
    fn event(self) -> &'static str {
        match self {
            HookAgent::ClaudeCode | HookAgent::Codex => "UserPromptSubmit",
            HookAgent::Gemini => "BeforeAgent",
        }
    }

    /// The user settings file the agent reads its hooks from.
    fn settings(self) -> Result<PathBuf, String> {
        let env_dir = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let home =
            || env_dir("HOME").ok_or_else(|| "HOME is not set: pass --settings FILE".to_string());
        Ok(match self {
            HookAgent::ClaudeCode => env_dir("CLAUDE_CONFIG_DIR")
                .map_or_else(|| home().map(|h| h.join(".claude")), Ok)?
                .join("settings.json"),
            HookAgent::Codex => env_dir("CODEX_HOME")
                .map_or_else(|| home().map(|h| h.join(".codex")), Ok)?
                .join("hooks.json"),
            HookAgent::Gemini => home()?.join(".gemini/settings.json"),
        })
    }

    /// What to tell the person besides the file.
    fn note(self) -> Option<&'static str> {
        match self {
            HookAgent::Codex => Some(
                "Codex releases before hooks were on by default need `[features] codex_hooks = true` in ~/.codex/config.toml",
            ),
            HookAgent::Gemini => Some(
                "Gemini CLI releases where hooks are experimental need `\"tools\": {\"enableHooks\": true}` in settings.json",
            ),
            HookAgent::ClaudeCode => None,
        }
    }
}

/// The hook command: this binary, by absolute path, with `checkpoint-hook --agent A`.
fn command(agent: HookAgent, given: Option<&str>) -> String {
    if let Some(c) = given {
        return c.to_string();
    }
    let exe = std::env::current_exe()
        .ok()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|| "fencefs".into());
    format!("{} {MARK} --agent {}", shell_word(&exe), agent.name())
}

/// `s` as one word for `sh -c` (the agents run the command through a shell).
fn shell_word(s: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._-+=:@%".contains(c);
    if !s.is_empty() && s.chars().all(plain) {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// The hook group for `agent`'s event.
fn group(agent: HookAgent, cmd: &str) -> Value {
    let mut hook = json!({"type": "command", "command": cmd, "timeout": 30});
    if agent == HookAgent::Gemini {
        hook["name"] = json!("fencefs-checkpoint");
    }
    json!({"hooks": [hook]})
}

/// The settings `doc` with our hook group in `agent`'s event (an earlier one replaced).
pub fn merged(mut doc: Value, agent: HookAgent, cmd: &str) -> Result<Value, String> {
    let root = doc
        .as_object_mut()
        .ok_or("the settings file is not a JSON object: left as it is")?;
    let hooks = root
        .entry("hooks")
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()
        .ok_or("its \"hooks\" is not an object: left as it is")?;
    let event = hooks
        .entry(agent.event())
        .or_insert_with(|| Value::Array(Vec::new()))
        .as_array_mut()
        .ok_or_else(|| {
            format!(
                "its \"hooks.{}\" is not an array: left as it is",
                agent.event()
            )
        })?;
    let ours = |g: &Value| {
        g["hooks"].as_array().is_some_and(|hs| {
            hs.iter()
                .any(|h| h["command"].as_str().is_some_and(|c| c.contains(MARK)))
        })
    };
    event.retain(|g| !ours(g));
    event.push(group(agent, cmd));
    Ok(doc)
}

/// `fencefs hooks print|install AGENT`.
pub(super) fn hooks(a: HooksArgs) -> i32 {
    match run(&a) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("fencefs: hooks: {e}");
            super::EXIT_ERR
        }
    }
}

fn run(a: &HooksArgs) -> Result<(), String> {
    let cmd = command(a.agent, a.command.as_deref());
    let file = match &a.settings {
        Some(f) => f.clone(),
        None => a.agent.settings()?,
    };
    if a.action == "print" {
        let doc = merged(json!({}), a.agent, &cmd)?;
        crate::outln!("// add to {}", file.display());
        crate::outln!("{}", pretty(&doc)?);
        if let Some(n) = a.agent.note() {
            crate::outln!("// {n}");
        }
        return Ok(());
    }
    let backup = install(&file, a.agent, &cmd)?;
    crate::outln!(
        "installed the {} hook ({}) in {}{}",
        a.agent.name(),
        a.agent.event(),
        file.display(),
        backup.map_or(String::new(), |b| format!(
            "; the file as it was is in {}",
            b.display()
        ))
    );
    if let Some(n) = a.agent.note() {
        crate::outln!("note: {n}");
    }
    Ok(())
}

fn pretty(v: &Value) -> Result<String, String> {
    serde_json::to_string_pretty(v).map_err(|e| e.to_string())
}

/// Edits `file` in place (a backup of it first); returns the backup's path (`None`: there
/// was no file).
fn install(file: &Path, agent: HookAgent, cmd: &str) -> Result<Option<PathBuf>, String> {
    let shown = file.display();
    let old = match std::fs::read(file) {
        Ok(b) => Some(b),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(format!("{shown}: {e}")),
    };
    let doc = match &old {
        Some(b) if !b.iter().all(u8::is_ascii_whitespace) => serde_json::from_slice(b)
            .map_err(|e| format!("{shown}: not JSON ({e}): left as it is"))?,
        _ => json!({}),
    };
    let text = pretty(&merged(doc, agent, cmd).map_err(|e| format!("{shown}: {e}"))?)? + "\n";
    let backup = match &old {
        Some(b) => {
            let secs = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let mut name = file.as_os_str().to_owned();
            name.push(format!(".fencefs-backup-{secs}-{}", std::process::id()));
            let p = PathBuf::from(name);
            write_synced(&p, b)?;
            Some(p)
        }
        None => {
            if let Some(dir) = file.parent() {
                std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            }
            None
        }
    };
    let tmp = PathBuf::from(format!(
        "{}.fencefs-tmp-{}",
        file.display(),
        std::process::id()
    ));
    write_synced(&tmp, text.as_bytes())?;
    if let Ok(md) = std::fs::metadata(file) {
        let _ = std::fs::set_permissions(&tmp, md.permissions());
    }
    std::fs::rename(&tmp, file).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("{shown}: {e}")
    })?;
    Ok(backup)
}

fn write_synced(p: &Path, data: &[u8]) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    // 0600: a settings file's companions may hold tokens.
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(p)
        .map_err(|e| format!("{}: {e}", p.display()))?;
    f.write_all(data)
        .and_then(|()| f.sync_all())
        .map_err(|e| format!("{}: {e}", p.display()))
}

/// The prompt's first line from the hook event on stdin (`prompt`), or "".
pub fn prompt_message(event: &[u8]) -> String {
    let v: Value = serde_json::from_slice(event).unwrap_or(Value::Null);
    checkpoint::clean_message(v["prompt"].as_str().unwrap_or(""))
}

/// `fencefs checkpoint-hook`: seals a checkpoint through the channel; always exits 0.
pub(super) fn checkpoint_hook(a: crate::cli::CheckpointHookArgs) -> i32 {
    let msg = match &a.message {
        Some(m) => checkpoint::clean_message(m),
        None => {
            let mut buf = Vec::new();
            let _ = std::io::stdin().take(MAX_STDIN).read_to_end(&mut buf);
            prompt_message(&buf)
        }
    };
    if a.agent == HookAgent::Gemini {
        crate::outln!("{{}}");
    }
    let sock = a.socket.clone().or_else(|| {
        std::env::var_os(checkpoint::ENV)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    });
    let Some(sock) = sock else {
        return 0;
    };
    match checkpoint::request(&sock, &msg) {
        Ok(v) if v["ok"] == json!(true) => {}
        Ok(v) => eprintln!(
            "fencefs: no checkpoint: {}",
            v["error"].as_str().unwrap_or("refused")
        ),
        Err(e) => eprintln!("fencefs: no checkpoint: {e}"),
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_keeps_every_other_key_and_replaces_its_own_hook() {
        let doc = json!({
            "model": "x",
            "hooks": {
                "UserPromptSubmit": [{"hooks": [{"type": "command", "command": "other"}]}],
                "Stop": [{"hooks": [{"type": "command", "command": "s"}]}]
            },
            "permissions": {"allow": ["Bash(ls)"]}
        });
        let once = merged(
            doc.clone(),
            HookAgent::ClaudeCode,
            "/b/fencefs checkpoint-hook",
        )
        .unwrap();
        let twice = merged(
            once.clone(),
            HookAgent::ClaudeCode,
            "/c/fencefs checkpoint-hook",
        )
        .unwrap();
        let ev = twice["hooks"]["UserPromptSubmit"].as_array().unwrap();
        assert_eq!(ev.len(), 2, "{twice}");
        assert_eq!(ev[0]["hooks"][0]["command"], "other");
        assert_eq!(ev[1]["hooks"][0]["command"], "/c/fencefs checkpoint-hook");
        assert_eq!(twice["model"], "x");
        assert_eq!(twice["permissions"], doc["permissions"]);
        assert_eq!(twice["hooks"]["Stop"], doc["hooks"]["Stop"]);
        let g = merged(json!({}), HookAgent::Gemini, "f checkpoint-hook").unwrap();
        assert_eq!(
            g["hooks"]["BeforeAgent"][0]["hooks"][0]["name"],
            "fencefs-checkpoint"
        );
        assert!(merged(json!([1]), HookAgent::Codex, "c").is_err());
        assert!(merged(json!({"hooks": 3}), HookAgent::Codex, "c").is_err());
    }

    #[test]
    fn the_message_is_the_prompts_first_line() {
        let e = br#"{"session_id":"s","hook_event_name":"UserPromptSubmit","prompt":"Fix the tests\nthen docs"}"#;
        assert_eq!(prompt_message(e), "Fix the tests");
        assert_eq!(prompt_message(b"not json"), "");
        assert_eq!(prompt_message(br#"{"prompt":3}"#), "");
    }
}

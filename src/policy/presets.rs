//! Presets: rule sets built into fencefs (`presets = ["secrets", "agent-config"]`), each
//! rule with the reason it is there. PURE constants; `build.rs` adds a preset's rules to
//! the layer that names it, as if written there (same depth rule, same `except`), marked
//! with the preset's name for `explain` and the audit.
//!
//! Invariants: every pattern here compiles (tested in `tests/presets`), and every rule's
//! path is either anchored at the root or floating (`**/<one name glob>`), so no preset
//! rule makes directory renames elsewhere refused (see `Layer::dir_rename_allowed`).
//! Only `none` rules float: a floating rule granting `list` or more could match below
//! every directory, so it would lift every hidden directory to `list` (the visibility
//! lift) and show the names of `.ssh/`, `secrets/`, …; `agent-config`'s `read` rules are
//! therefore anchored at the root (where agents and editors read them).

use super::Access;

/// One built-in rule.
#[derive(Debug)]
pub struct PresetRule {
    /// The rule's `path` glob.
    pub path: &'static str,
    /// Its access.
    pub access: Access,
    /// Its `except` globs.
    pub except: &'static [&'static str],
    /// Why it is there (printed by `fencefs presets`).
    pub why: &'static str,
}

/// A named rule set.
#[derive(Debug)]
pub struct Preset {
    /// The name used in `presets = [...]`.
    pub name: &'static str,
    /// One line on what it does.
    pub about: &'static str,
    /// Its rules.
    pub rules: &'static [PresetRule],
}

/// The trees package managers and vendoring tools write: CA bundles and test keys there
/// are data, not secrets.
const PACKAGE_TREES: &[&str] = &[
    "**/site-packages/**",
    "**/dist-packages/**",
    "**/.venv/**",
    "**/venv/**",
    "**/.tox/**",
    "**/.nox/**",
    "**/node_modules/**",
    "**/.cargo/registry/**",
    "**/.cargo/git/**",
    "**/vendor/**",
];

/// Every preset.
pub const PRESETS: &[Preset] = &[
    Preset {
        name: "secrets",
        about: "private keys, certificates, .env files and cloud/registry credentials hidden (access none)",
        rules: &[
            PresetRule {
                path: "**/{*.pem,*.key,*.p12,*.pfx,*.crt,*.cer,*.jks,*.keystore,id_rsa,id_dsa,id_ecdsa,id_ed25519,id_ecdsa_sk,id_ed25519_sk}",
                access: Access::None,
                except: PACKAGE_TREES,
                why: "private keys, certificates and SSH identities, except in package managers' trees (certifi's cacert.pem, npm's test certificates)",
            },
            PresetRule {
                path: "**/{.env,.env.*}",
                access: Access::None,
                except: &[
                    "**/.env.example",
                    "**/.env.sample",
                    "**/.env.template",
                    "**/node_modules/**",
                    "**/site-packages/**",
                    "**/.venv/**",
                    "**/venv/**",
                ],
                why: "dotenv files, except committed templates and those inside package trees",
            },
            PresetRule {
                path: "**/{.aws,.azure,.ssh,.kube,.gnupg}",
                access: Access::None,
                except: &[],
                why: "cloud credentials (AWS, Azure), SSH keys and known hosts, kubeconfigs, GnuPG keyrings",
            },
            PresetRule {
                path: "**/{.netrc,.npmrc,.pypirc,.git-credentials,.pgpass,kubeconfig,*.kubeconfig}",
                access: Access::None,
                except: &[],
                why: "registry and service tokens (netrc, npm, PyPI, git credential store, PostgreSQL) and kubeconfig files",
            },
            PresetRule {
                path: ".docker/config.json",
                access: Access::None,
                except: &[],
                why: "Docker registry credentials (at the workspace root, where DOCKER_CONFIG=.docker puts them)",
            },
            PresetRule {
                path: "**/{*.tfstate,*.tfstate.backup}",
                access: Access::None,
                except: &[],
                why: "Terraform state: holds every secret the configuration created",
            },
        ],
    },
    Preset {
        name: "agent-config",
        about: "files that make a host program run code or change an agent's rights, read-only (access read, in every mode)",
        rules: &[
            PresetRule {
                path: ".git/hooks",
                access: Access::Read,
                except: &[],
                why: "git runs hooks on the host (commit, checkout, push)",
            },
            PresetRule {
                path: ".git/config",
                access: Access::Read,
                except: &[],
                why: "git config can name programs to run (core.fsmonitor, core.pager, aliases, filters)",
            },
            PresetRule {
                path: "{.claude,.mcp.json,.cursor,.gemini}",
                access: Access::Read,
                except: &[],
                why: "agent settings, permissions, hooks and MCP servers (Claude Code, Cursor, Gemini CLI)",
            },
            PresetRule {
                path: ".vscode/tasks.json",
                access: Access::Read,
                except: &[],
                why: "VS Code runs tasks (folderOpen tasks start on their own)",
            },
            PresetRule {
                path: ".vscode/settings.json",
                access: Access::Read,
                except: &[],
                why: "VS Code settings can name interpreters, formatters and terminals to run",
            },
            PresetRule {
                path: "{.husky,.envrc,.pre-commit-config.yaml}",
                access: Access::Read,
                except: &[],
                why: "husky git hooks, direnv's .envrc (run on cd), pre-commit's hook list",
            },
        ],
    },
    Preset {
        name: "home",
        about: "for a home directory served by `fencefs run --home fence`: credentials, keyrings, browser profiles and shell histories hidden; the agents' own state and the tool caches writable (their settings, hooks and installed binaries read-only); a layer with `default = \"read\"` keeps the rest read-only",
        rules: HOME,
    },
];

/// The `home` preset's rules (paths relative to $HOME).
const HOME: &[PresetRule] = &[
    PresetRule {
        path: "{.ssh,.gnupg,.aws,.azure,.kube,.password-store,.pki,.mozilla,.thunderbird,.vault-token}",
        access: Access::None,
        except: &[],
        why: "keys, cloud credentials, password stores and browser profiles",
    },
    PresetRule {
        path: ".config/{gcloud,gh,hub,rclone,google-chrome,chromium,BraveSoftware,microsoft-edge,vivaldi,opera}",
        access: Access::None,
        except: &[],
        why: "cloud and forge credentials, browser profiles (cookies, saved passwords)",
    },
    PresetRule {
        path: "{.netrc,.git-credentials,.pgpass,.npmrc,.pypirc,.docker/config.json,.terraform.d/credentials.tfrc.json}",
        access: Access::None,
        except: &[],
        why: "tokens and passwords of package registries, databases and git hosts",
    },
    PresetRule {
        path: ".local/share/{keyrings,kwalletd}",
        access: Access::None,
        except: &[],
        why: "the desktop's keyrings",
    },
    PresetRule {
        path: "{.bash_history,.zsh_history,.histfile,.python_history,.node_repl_history,.psql_history,.mysql_history,.sqlite_history,.lesshst,.local/share/fish/fish_history}",
        access: Access::None,
        except: &[],
        why: "shell and REPL histories (secrets typed on command lines)",
    },
    PresetRule {
        path: "{.local/state/fencefs,.config/fencefs}",
        access: Access::None,
        except: &[],
        why: "fencefs's own staging areas and settings: never the agent's to read or change",
    },
    PresetRule {
        path: "{.claude*,.codex,.gemini,.aider*,.cursor,.continue,.opencode}",
        access: Access::Write,
        except: &[],
        why: "the agents' own state (sessions, history, caches)",
    },
    PresetRule {
        path: ".config/{claude,codex,gemini,opencode,aider,github-copilot,cursor}",
        access: Access::Write,
        except: &[],
        why: "the agents' own configuration directories",
    },
    PresetRule {
        path: "{.local/share/{claude,opencode,aider},.local/state/{claude,opencode}}",
        access: Access::Write,
        except: &[],
        why: "the agents' own data",
    },
    PresetRule {
        path: "{.cache,.npm,.cargo,.rustup,.yarn,.pnpm-store,.local/share/pnpm,.bun,.deno,.gradle,.m2}",
        access: Access::Write,
        except: &[],
        why: "caches and package stores of the usual tools",
    },
    PresetRule {
        path: "{.claude/settings.json,.claude/hooks,.codex/config.toml,.gemini/settings.json}",
        access: Access::Read,
        except: &[],
        why: "an agent's permissions and hooks: changing them would change its rights or run code on the host",
    },
    PresetRule {
        path: "{.cargo/bin,.cargo/config,.cargo/config.toml,.rustup/toolchains,.rustup/settings.toml}",
        access: Access::Read,
        except: &[],
        why: "programs and settings the host user runs next: a planted binary would run outside the fence",
    },
];

/// The preset called `name`.
pub fn find(name: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.name == name)
}

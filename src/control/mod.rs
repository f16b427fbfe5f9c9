//! The control socket (`--control`): a Unix stream socket speaking JSON lines, for status,
//! synchronous reloads and approvals of held requests (SPEC.md, "Control socket").
//!
//! - [`proto`]: the messages (pure).
//! - [`server`]: the daemon side, one thread polling every peer.
//! - [`lane`]: threads the long commands (staging operations, reloads) run on, so the
//!   control thread keeps answering approvals meanwhile.
//! - [`peer`]: one peer's connection: commands in, answers streamed and events queued out.
//! - [`client`]: `fencefs ctl` and `fencefs approve`.
//! - [`ask_exec`]: `--ask-exec CMD`, run for every newly held request (notifications).
//! - [`sockpath`]: socket paths longer than `sun_path`.
//! - [`checkpoint`]: the agent's checkpoint channel, a separate socket that only seals
//!   checkpoints (the one thing the agent may reach).
//!
//! The socket must live outside the mount and out of the agent's reach: whoever may use
//! it can approve what the policy only asks for.

pub mod ask_exec;
pub mod checkpoint;
pub mod client;
pub mod lane;
pub mod peer;
pub mod proto;
pub mod server;
pub mod sockpath;

//! The one staging operation the agent may ask for: seal a checkpoint (SPEC "Per-turn
//! checkpoints"). The checkpoint channel (`control/checkpoint.rs`) calls [`seal`]; nothing
//! else here reads, applies, discards or rewinds.
//!
//! Invariants:
//! - The log (`DIR/checkpoints.json`) never grows past [`MAX_CHECKPOINTS`] entries through
//!   this path: at the cap a seal is refused with one line and nothing is written.
//! - A turn that changed nothing since the last live checkpoint seals nothing (the answer
//!   says which checkpoint already marks that state), so a hook firing on every prompt
//!   spends no layer on an empty turn and `--since` of the last checkpoint still shows
//!   exactly what was done after it.
//! - It runs through [`Live::swap`] like the control socket's `checkpoint`, serialised
//!   with every other staging operation of this daemon ([`super::control::serial`]).

use super::StageError;
use std::path::Path;

use serde_json::{Value, json};

use super::Area;
use super::control::Live;
use super::layers;

/// Checkpoints a staging area's log may hold when the agent asks for one.
pub const MAX_CHECKPOINTS: usize = 1000;

/// Seals checkpoint N with `message` (already cut and cleaned by the channel) in the
/// staging area `dir`, or says why not. The answer: `{"checkpoint":{…},"sealed":true}`,
/// or `{"checkpoint":N,"sealed":false}` when nothing changed since checkpoint N.
pub fn seal(dir: &Path, live: &dyn Live, message: &str) -> Result<Value, StageError> {
    let _one = super::control::serial();
    let area = Area::open(dir)?;
    let log = layers::log(&area.dir)?;
    if log.len() >= MAX_CHECKPOINTS {
        return Err(format!(
            "refused: this staging area holds {MAX_CHECKPOINTS} checkpoints, the most the agent's channel seals (a person can apply or discard and start a new staging area)"
        )
        .into());
    }
    let last = layers::live(&area.dir)?.last().copied();
    // A count that failed seals anyway (the turn may have changed something).
    let counted = super::session::count_for_checkpoint(&area);
    let n = counted.unwrap_or(0);
    if let (Some(last), Some(0)) = (last, counted) {
        return Ok(json!({"checkpoint": last, "sealed": false}));
    }
    live.swap(true, &mut || {
        let c = layers::checkpoint(&area.dir, message, n)?;
        Ok(json!({"checkpoint": c, "sealed": true}))
    })
}

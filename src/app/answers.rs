//! `fencefs answers FILE`: the answers remembered for good in an `--answers` file, one line
//! each, for a person to review (every path quoted; exit 1 with file:line:column errors
//! when the file is invalid, as `fencefs check` does for a policy).

use std::path::Path;

use crate::approvals::answers;
use crate::quote;

/// Lists FILE's answers; returns the exit code.
pub fn list(file: &Path) -> i32 {
    match answers::read(file) {
        Ok((_, list)) => {
            if list.is_empty() {
                crate::outln!("no answers");
            }
            for a in list {
                let shown = if a.path.is_empty() {
                    "."
                } else {
                    a.path.as_str()
                };
                crate::outln!(
                    "{} {} {} uid {} (by {}, {})",
                    if a.allow { "allow" } else { "deny" },
                    if a.write { "write" } else { "read" },
                    quote::quote(shown.as_bytes()),
                    a.uid,
                    quote::escape(a.by.as_bytes()),
                    quote::escape(a.ts.as_bytes()),
                );
            }
            0
        }
        Err(errs) => {
            for e in errs {
                eprintln!("{}", quote::escape(e.to_string().as_bytes()));
            }
            super::EXIT_ERR
        }
    }
}

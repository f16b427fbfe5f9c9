//! The only code that touches the host file system.

pub mod budget;
pub mod copy;
pub mod handle;
pub mod ignore_scan;
pub mod inode;
pub mod path;
pub mod privilege;
pub mod programs;
pub mod roots;
pub mod sys;
pub mod union;
pub mod worktree;

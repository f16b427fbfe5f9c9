//! The only code that touches the host file system.

pub mod handle;
pub mod inode;
pub mod sys;

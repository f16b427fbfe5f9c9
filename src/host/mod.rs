//! The only code that touches the host file system.

pub mod budget;
pub mod handle;
pub mod inode;
pub mod programs;
pub mod sys;

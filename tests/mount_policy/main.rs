//! The policy through a real mount: mode × access level × operation → exact errno, and the
//! host never changes after a refusal (SPEC "Access levels", "Sandbox modes", "Errors").

#[path = "../common/mod.rs"]
mod common;

use common::*;
use libc::{EACCES, EEXIST, ENOENT, EPERM, EROFS};
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use table::*;

mod hidden;
mod renames;
mod special;
mod table;

//! The FUSE descriptor handed from a privileged mounter to an unprivileged server
//! (`fencefs csi` → `fencefs mount --fuse-fd-from`): open `/dev/fuse`, mount it with
//! mount(2) and `fd=N`, pass it over a Unix socket (SCM_RIGHTS) and take it on the other
//! side, checking that what arrived is a FUSE device.
//!
//! Invariants: a received descriptor is owned at once (`OwnedFd`, close-on-exec) and every
//! extra descriptor in the same message is closed; a descriptor that is not the character
//! device 10:229 (`/dev/fuse`) is refused. Errors keep their raw errno.
#![allow(unsafe_code)]

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::Path;

use nix::mount::{MsFlags, mount};
use nix::sys::socket::{
    ControlMessage, ControlMessageOwned, MsgFlags, getsockopt, recvmsg, sendmsg, sockopt,
};

/// What the mounter sends with the descriptor (then a space and the volume's target path);
/// the server answers `ok` or `error: WHY`, one line. The server keeps the connection open
/// while it serves: the mounter reads its end's hang-up as the server's exit.
pub const HELLO: &str = "fencefs-fuse-fd/1";

/// What the mounter sends instead, without a descriptor, to a server it will not hand one
/// (then a space and why: another server serves the volume); the server gives up.
pub const REFUSED: &str = "fencefs-fuse-fd/1 refused:";

/// `/dev/fuse`'s device number (misc major 10, minor 229).
const FUSE_MAJOR: u32 = 10;
const FUSE_MINOR: u32 = 229;

fn errno(e: nix::Error) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

/// Opens `/dev/fuse` read-write, close-on-exec.
pub fn open_dev() -> io::Result<OwnedFd> {
    Ok(std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")?
        .into())
}

/// How [`mount_dev`] mounts.
pub struct MountSpec<'a> {
    /// The mount table's source column.
    pub fsname: &'a str,
    /// The only uid and gid the kernel lets in (unless `allow_other`).
    pub uid: u32,
    pub gid: u32,
    pub allow_other: bool,
    pub read_only: bool,
}

/// Mounts the FUSE connection `dev` at `target`: type `fuse.fencefs`, `nosuid,nodev`,
/// `fd=N`, `user_id`/`group_id` from `spec`. Returns at once: the kernel's INIT waits on
/// `dev` for whoever serves it.
pub fn mount_dev(dev: BorrowedFd<'_>, target: &Path, spec: &MountSpec<'_>) -> io::Result<()> {
    let mut data = format!(
        "fd={},rootmode=40000,user_id={},group_id={}",
        dev.as_raw_fd(),
        spec.uid,
        spec.gid
    );
    if spec.allow_other {
        data.push_str(",allow_other,default_permissions");
    }
    let mut flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    if spec.read_only {
        flags |= MsFlags::MS_RDONLY;
    }
    mount(
        Some(spec.fsname),
        target,
        Some("fuse.fencefs"),
        flags,
        Some(data.as_str()),
    )
    .map_err(errno)
}

/// Makes the mount at `target` shared (its own peer group when its parent is private):
/// a bind of it made with slave propagation (a container's `HostToContainer` volume mount)
/// then receives the mounts made on top of it later, such as a fresh FUSE mount for a
/// restarted server.
pub fn make_shared(target: &Path) -> io::Result<()> {
    mount(
        None::<&str>,
        target,
        None::<&str>,
        MsFlags::MS_SHARED,
        None::<&str>,
    )
    .map_err(errno)
}

/// Sends `dev` with the bytes `msg` over the connected stream socket `sock`.
pub fn send(sock: BorrowedFd<'_>, dev: BorrowedFd<'_>, msg: &[u8]) -> io::Result<()> {
    let fds = [dev.as_raw_fd()];
    let cmsg = [ControlMessage::ScmRights(&fds)];
    let iov = [IoSlice::new(msg)];
    let n = sendmsg::<()>(sock.as_raw_fd(), &iov, &cmsg, MsgFlags::MSG_NOSIGNAL, None)
        .map_err(errno)?;
    if n != msg.len() {
        return Err(io::Error::new(io::ErrorKind::WriteZero, "short send"));
    }
    Ok(())
}

/// Receives one message from `sock`: its bytes and the descriptor it carried, if any.
/// Extra descriptors are closed; `Ok((bytes, None))` when the message held none.
pub fn recv(sock: BorrowedFd<'_>) -> io::Result<(Vec<u8>, Option<OwnedFd>)> {
    let mut buf = vec![0u8; 4096];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 4]);
    let (n, fds) = {
        let mut iov = [IoSliceMut::new(&mut buf)];
        let m = recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(errno)?;
        let mut fds = Vec::new();
        for c in m.cmsgs().map_err(errno)? {
            if let ControlMessageOwned::ScmRights(raw) = c {
                fds.extend(raw);
            }
        }
        (m.bytes, fds)
    };
    buf.truncate(n);
    // SAFETY: the kernel installed each of these descriptors in this process for this
    // message (SCM_RIGHTS); nothing else owns them.
    let mut owned: Vec<OwnedFd> = fds
        .into_iter()
        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
        .collect();
    let first = if owned.is_empty() {
        None
    } else {
        Some(owned.remove(0))
    };
    Ok((buf, first))
}

/// Whether `fd` is the FUSE device (`/dev/fuse`, 10:229).
pub fn is_fuse_dev(fd: BorrowedFd<'_>) -> io::Result<bool> {
    let st = nix::sys::stat::fstat(fd).map_err(errno)?;
    let kind = st.st_mode & libc::S_IFMT;
    Ok(kind == libc::S_IFCHR
        && libc::major(st.st_rdev) == FUSE_MAJOR
        && libc::minor(st.st_rdev) == FUSE_MINOR)
}

/// The uid of the process at the other end of the Unix socket `sock`.
pub fn peer_uid(sock: BorrowedFd<'_>) -> io::Result<u32> {
    getsockopt(&sock, sockopt::PeerCredentials)
        .map(|c| c.uid())
        .map_err(errno)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_descriptor_and_its_message_cross_a_socket() {
        let (a, b) = UnixStream::pair().unwrap_or_else(|e| panic!("{e}"));
        let f = std::fs::File::open("/dev/null").unwrap_or_else(|e| panic!("{e}"));
        send(a.as_fd(), f.as_fd(), b"hello").unwrap_or_else(|e| panic!("{e}"));
        let (msg, fd) = recv(b.as_fd()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(msg, b"hello");
        let fd = fd.unwrap_or_else(|| panic!("no descriptor"));
        assert!(
            !is_fuse_dev(fd.as_fd()).unwrap_or(true),
            "/dev/null is not FUSE"
        );
        assert_eq!(
            peer_uid(b.as_fd()).ok(),
            Some(nix::unistd::geteuid().as_raw())
        );
    }
}

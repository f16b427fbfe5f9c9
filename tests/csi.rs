//! `fencefs csi` driven as the kubelet drives it: a gRPC client on the driver's Unix
//! socket publishes an inline volume at a kubelet-shaped target path, the sidecar
//! (`fencefs mount --fuse-fd-from`, uid 1000, no capabilities) takes the FUSE descriptor
//! from the emptyDir socket and serves it, and a process as uid 1000 uses the mount under
//! the policy. Also: repeated publish, unpublish with the sidecar killed, bad attributes
//! (exact gRPC codes), a sidecar that never comes, staging unprivileged, the policy
//! reloaded by the kubelet's ConfigMap `..data` swap (`--watch-policy`), and a sidecar
//! killed with SIGKILL and restarted: the volume resumes (also in a container's
//! `HostToContainer` view of it made before), the staged work is still there, and a second
//! sidecar beside a live one is refused (by the driver only: not by the pod's uid).
//!
//! Every test unpublishes (or detaches) what it published and kills only the children it
//! spawned; no mount is left behind (checked at the end of each test).

// tonic's `Status` is the gRPC client's error type, used as it comes.
#![allow(clippy::result_large_err)]

mod common;

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bpfman_csi::v1 as csi;
use common::*;
use csi::identity_client::IdentityClient;
use csi::node_client::NodeClient;
use tonic::transport::{Channel, Endpoint, Uri};

const UID: u32 = 1000;

/// A node: the driver on ROOT/csi.sock, a pod directory laid out as the kubelet's.
struct Node {
    root: PathBuf,
    driver: Child,
    rt: tokio::runtime::Runtime,
    node: NodeClient<Channel>,
    identity: IdentityClient<Channel>,
}

impl Node {
    fn start(name: &str) -> Node {
        require_fuse();
        let ws = Workspace::new(name);
        let root = ws.root.clone();
        std::mem::forget(ws);
        let sock = root.join("csi.sock");
        let mut driver = Command::new(BIN)
            .args(["csi", "--node-id", "test-node", "--endpoint"])
            .arg(format!("unix://{}", sock.display()))
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stderr(fs::File::create(root.join("driver.stderr")).unwrap())
            .spawn()
            .unwrap();
        assert!(
            eventually(Duration::from_secs(10), || sock.exists()),
            "driver socket"
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        // The socket's name exists a moment before it listens (bind, then listen): a
        // connection refused then is tried again.
        let connected = rt.block_on(async {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            loop {
                let s = sock.clone();
                let r = Endpoint::try_from("http://[::]:50051")
                    .unwrap()
                    .connect_with_connector(tower::service_fn(move |_: Uri| {
                        tokio::net::UnixStream::connect(s.clone())
                    }))
                    .await;
                match r {
                    Err(_) if std::time::Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    r => break r,
                }
            }
        });
        let ch = match connected {
            Ok(ch) => ch,
            Err(e) => {
                let _ = driver.kill();
                let _ = driver.wait();
                panic!("cannot connect to the driver: {e}")
            }
        };
        Node {
            root,
            driver,
            rt,
            node: NodeClient::new(ch.clone()),
            identity: IdentityClient::new(ch),
        }
    }

    /// A pod: its workspace (the PVC), the emptyDir for the socket, the target's parent.
    fn pod(&self, pod: &str) -> Pod {
        let vols = self.root.join("pods").join(pod).join("volumes");
        let target = vols.join("kubernetes.io~csi/workspace/mount");
        let empty = vols.join("kubernetes.io~empty-dir/fencefs");
        let pvc = self.root.join(format!("{pod}-pvc"));
        for d in [target.parent().unwrap(), &empty, &pvc.join("work")] {
            mkdirp(d);
        }
        chown_tree(&empty, UID);
        chown_tree(&pvc, UID);
        let policy = self.root.join(format!("{pod}-policy.toml"));
        fs::write(&policy, POLICY).unwrap();
        fs::set_permissions(&policy, fs::Permissions::from_mode(0o644)).unwrap();
        Pod {
            target,
            sock: empty.join("fencefs.sock"),
            src: pvc.join("work"),
            pvc,
            policy,
            sidecar: None,
        }
    }

    fn publish(&mut self, p: &Pod, ctx: &[(&str, &str)]) -> Result<(), tonic::Status> {
        let r = csi::NodePublishVolumeRequest {
            volume_id: "csi-test-vol".into(),
            target_path: p.target.display().to_string(),
            volume_capability: Some(mount_cap()),
            volume_context: ctx
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        };
        self.rt.block_on(self.node.node_publish_volume(r)).map(drop)
    }

    fn unpublish(&mut self, p: &Pod) -> Result<(), tonic::Status> {
        let r = csi::NodeUnpublishVolumeRequest {
            volume_id: "csi-test-vol".into(),
            target_path: p.target.display().to_string(),
        };
        self.rt
            .block_on(self.node.node_unpublish_volume(r))
            .map(drop)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own, not yet reaped child.
        unsafe { libc::kill(self.driver.id() as i32, libc::SIGTERM) };
        let _ = self.driver.wait();
    }
}

fn mount_cap() -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(csi::volume_capability::AccessType::Mount(
            csi::volume_capability::MountVolume::default(),
        )),
        access_mode: Some(csi::volume_capability::AccessMode {
            mode: csi::volume_capability::access_mode::Mode::SingleNodeWriter as i32,
        }),
    }
}

const POLICY: &str = r#"
mode = "workspace-write"
default = "write"
writable_roots = ["."]

[[rule]]
path = "secrets"
access = "none"

[[rule]]
path = "docs"
access = "read"
"#;

/// The standard attributes of the test pod.
const ATTRS: &[(&str, &str)] = &[
    ("uid", "1000"),
    ("gid", "1000"),
    ("socketVolume", "fencefs"),
    ("csi.storage.k8s.io/ephemeral", "true"),
    ("csi.storage.k8s.io/pod.name", "agent"),
];

struct Pod {
    target: PathBuf,
    sock: PathBuf,
    pvc: PathBuf,
    src: PathBuf,
    policy: PathBuf,
    sidecar: Option<Child>,
}

impl Pod {
    /// The sidecar: uid/gid 1000, every capability dropped (as a pod's restricted
    /// securityContext), serving the descriptor it is handed.
    fn start_sidecar(&mut self, extra: &[&str]) {
        let child = self.spawn_sidecar(extra, "sidecar.stderr");
        self.sidecar = Some(child);
    }

    /// A sidecar process logging to PVC/`log`; the caller owns it.
    fn spawn_sidecar(&self, extra: &[&str], log: &str) -> Child {
        let log = self.pvc.join(log);
        Command::new("setpriv")
            .args([
                "--reuid=1000",
                "--regid=1000",
                "--clear-groups",
                "--inh-caps=-all",
                "--bounding-set=-all",
                "--no-new-privs",
                BIN,
                "mount",
                "--fuse-fd-from",
            ])
            .arg(&self.sock)
            .arg("-p")
            .arg(&self.policy)
            .args(extra)
            .args(
                std::env::var("SIDECAR_EXTRA")
                    .unwrap_or_default()
                    .split_whitespace(),
            )
            .arg(&self.src)
            .env(
                "RUST_LOG",
                std::env::var("SIDECAR_LOG").unwrap_or("info".into()),
            )
            .stdin(Stdio::null())
            .stderr(fs::File::create(log).unwrap())
            .spawn()
            .unwrap()
    }

    fn sidecar_log(&self) -> String {
        fs::read_to_string(self.pvc.join("sidecar.stderr")).unwrap_or_default()
    }

    fn kill_sidecar(&mut self) {
        if let Some(mut c) = self.sidecar.take() {
            // SAFETY: kill(2) on our own, not yet reaped child.
            unsafe { libc::kill(c.id() as i32, libc::SIGKILL) };
            let _ = c.wait();
        }
    }

    /// Waits until uid 1000 sees the workspace through the mount.
    fn wait_served(&self) {
        let t = self.target.display().to_string();
        let ok = eventually(Duration::from_secs(15), || {
            sh_as(UID, Path::new("/"), &format!("test -f '{t}/README'")).ok()
        });
        assert!(ok, "not served; sidecar log:\n{}", self.sidecar_log());
    }

    /// `sh -c` as uid 1000 in the mount (started outside it: the mount may be dead).
    fn sh(&self, script: &str) -> Out {
        let t = self.target.display();
        sh_as(UID, Path::new("/"), &format!("cd '{t}' && {script}"))
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        self.kill_sidecar();
        // Never leave a mount behind, whatever the test did.
        while mount_fstype(&self.target).is_some() {
            let _ = Command::new("umount").arg("-l").arg(&self.target).status();
        }
    }
}

fn workspace(p: &Pod) {
    put(&p.src.join("README"), b"hello\n", 0o644);
    put(&p.src.join("secrets/key"), b"k\n", 0o600);
    put(&p.src.join("docs/guide.md"), b"guide\n", 0o644);
    chown_tree(&p.pvc, UID);
}

fn code(r: Result<(), tonic::Status>) -> (tonic::Code, String) {
    match r {
        Ok(()) => (tonic::Code::Ok, String::new()),
        Err(s) => (s.code(), s.message().to_string()),
    }
}

#[test]
fn identity_and_node_info() {
    let mut n = Node::start("csi-identity");
    let info =
        n.rt.block_on(n.identity.get_plugin_info(csi::GetPluginInfoRequest {}))
            .unwrap()
            .into_inner();
    assert_eq!(info.name, "fencefs.dev");
    assert!(!info.vendor_version.is_empty());
    let probe =
        n.rt.block_on(n.identity.probe(csi::ProbeRequest {}))
            .unwrap()
            .into_inner();
    assert_eq!(probe.ready, Some(true));
    let caps =
        n.rt.block_on(
            n.identity
                .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {}),
        )
        .unwrap()
        .into_inner();
    assert!(caps.capabilities.is_empty(), "node plugin only");
    let ni =
        n.rt.block_on(n.node.node_get_info(csi::NodeGetInfoRequest {}))
            .unwrap()
            .into_inner();
    assert_eq!(ni.node_id, "test-node");
    let nc =
        n.rt.block_on(
            n.node
                .node_get_capabilities(csi::NodeGetCapabilitiesRequest {}),
        )
        .unwrap()
        .into_inner();
    assert!(nc.capabilities.is_empty());
}

#[test]
fn publish_serve_republish_unpublish() {
    let mut n = Node::start("csi-publish");
    let mut p = n.pod("pod-a");
    workspace(&p);
    // The kubelet publishes before any container of the pod runs.
    n.publish(&p, ATTRS).unwrap();
    assert_eq!(mount_fstype(&p.target).as_deref(), Some("fuse.fencefs"));
    let opts = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = opts
        .lines()
        .find(|l| l.contains(&p.target.display().to_string()))
        .unwrap();
    assert!(line.contains("nosuid") && line.contains("nodev"), "{line}");
    assert!(
        line.contains("user_id=1000") && line.contains("group_id=1000"),
        "{line}"
    );
    p.start_sidecar(&[]);
    p.wait_served();
    let log = p.sidecar_log();
    assert!(log.contains("FUSE descriptor received"), "{log}");
    // The policy holds for uid 1000 (another process than the sidecar).
    p.sh("cat README").assert_ok("read");
    let o = p.sh("cat secrets/key");
    assert!(o.stderr.contains("No such file"), "hidden: {}", o.stderr);
    let o = p.sh("echo x > docs/guide.md");
    assert!(
        o.stderr.contains("Permission denied") || o.stderr.contains("Read-only"),
        "read-only: {}",
        o.stderr
    );
    p.sh("echo new > made.txt").assert_ok("write");
    assert_eq!(fs::read(p.src.join("made.txt")).unwrap(), b"new\n");
    // Root (the kubelet, another uid) is kept out by the kernel: user_id=1000 only.
    let o = sh_in(Path::new("/"), &format!("ls {}", p.target.display()));
    assert!(!o.ok(), "root listed the mount");
    // Idempotent: the same publish again succeeds and mounts nothing more.
    n.publish(&p, ATTRS).unwrap();
    let count = fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.contains(&p.target.display().to_string()))
        .count();
    assert_eq!(count, 1);
    // The same target with other attributes: ALREADY_EXISTS.
    let mut other: Vec<_> = ATTRS.to_vec();
    other[0] = ("uid", "1001");
    assert_eq!(code(n.publish(&p, &other)).0, tonic::Code::AlreadyExists);
    n.unpublish(&p).unwrap();
    assert!(mount_fstype(&p.target).is_none());
    assert!(!p.target.exists(), "target directory removed");
    // The sidecar's session ended with the mount.
    let mut c = p.sidecar.take().unwrap();
    let done = eventually(Duration::from_secs(10), || {
        matches!(c.try_wait(), Ok(Some(_)))
    });
    assert!(done, "sidecar still running after unpublish");
    // Unpublish again: nothing there, still OK.
    n.unpublish(&p).unwrap();
}

#[test]
fn unpublish_after_the_sidecar_died() {
    let mut n = Node::start("csi-killed");
    let mut p = n.pod("pod-k");
    workspace(&p);
    n.publish(&p, ATTRS).unwrap();
    p.start_sidecar(&[]);
    p.wait_served();
    p.kill_sidecar();
    let o = p.sh("cat README");
    assert!(!o.ok(), "served after the sidecar died");
    n.unpublish(&p).unwrap();
    assert!(mount_fstype(&p.target).is_none(), "mount left behind");
    assert!(!p.target.exists());
}

/// A container's view of the volume as the kubelet makes it for a `mountPropagation:
/// HostToContainer` volume mount: a bind of the target, then a slave of it. Detached
/// (with whatever reached it) when dropped, as its container's end would.
struct View(PathBuf);

impl Drop for View {
    fn drop(&mut self) {
        while mount_fstype(&self.0).is_some() {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

fn container_view(target: &Path, view: &Path) -> View {
    mkdirp(view);
    let ok = Command::new("mount")
        .arg("--bind")
        .arg(target)
        .arg(view)
        .status()
        .unwrap()
        .success();
    assert!(ok, "bind the target");
    let ok = Command::new("mount")
        .arg("--make-slave")
        .arg(view)
        .status()
        .unwrap()
        .success();
    assert!(ok, "make the view a slave");
    View(view.to_path_buf())
}

fn driver_log(n: &Node) -> String {
    fs::read_to_string(n.root.join("driver.stderr")).unwrap_or_default()
}

/// Starts a sidecar that must exit by itself, unsuccessfully, within 15 s; its log.
fn sidecar_that_exits(p: &Pod, args: &[&str], name: &str) -> String {
    let log = format!("{name}.stderr");
    let mut c = p.spawn_sidecar(args, &log);
    let mut status = None;
    let ended = eventually(Duration::from_secs(15), || {
        status = c.try_wait().unwrap();
        status.is_some()
    });
    if !ended {
        // SAFETY: kill(2) on our own, not yet reaped child.
        unsafe { libc::kill(c.id() as i32, libc::SIGKILL) };
        let _ = c.wait();
    }
    let text = fs::read_to_string(p.pvc.join(&log)).unwrap_or_default();
    assert!(ended, "the {name} sidecar did not exit:\n{text}");
    assert!(!status.unwrap().success(), "{text}");
    text
}

#[test]
fn a_restarted_sidecar_resumes_the_volume_and_a_second_one_is_refused() {
    let mut n = Node::start("csi-resume");
    let mut p = n.pod("pod-r");
    workspace(&p);
    let stage = p.pvc.join("stage");
    let control = p.pvc.join("control.sock");
    let staged = [
        "--stage",
        stage.to_str().unwrap(),
        "--control",
        control.to_str().unwrap(),
    ];
    n.publish(&p, ATTRS).unwrap();
    p.start_sidecar(&staged);
    p.wait_served();
    // The agent container's view, made when it started (before any restart).
    let view = n.root.join("pod-r-agent-view");
    let _view = container_view(&p.target, &view);
    let in_view = |script: &str| {
        sh_as(
            UID,
            Path::new("/"),
            &format!("cd '{}' && {script}", view.display()),
        )
    };
    in_view("cat README").assert_ok("the container's view serves");
    p.sh("echo first > first.txt && echo more >> README")
        .assert_ok("the first sidecar stages");
    // The sidecar dies hard (OOM, a node's kill): the volume answers ENOTCONN.
    p.kill_sidecar();
    let o = p.sh("cat README");
    assert!(!o.ok(), "served after the sidecar died");
    let dead = eventually(Duration::from_secs(10), || {
        driver_log(&n).contains("the sidecar that served it is gone")
    });
    assert!(dead, "driver log:\n{}", driver_log(&n));
    // Its restart (the kubelet's restartPolicy: Always) resumes it, on the same DIR.
    p.start_sidecar(&staged);
    p.wait_served();
    assert!(
        driver_log(&n).contains("mounted afresh on top of the dead mount (resume 1 of"),
        "{}",
        driver_log(&n)
    );
    assert_eq!(p.sh("cat first.txt").stdout, "first\n");
    assert_eq!(p.sh("cat README").stdout, "hello\nmore\n");
    // The container's view got the fresh mount too, with no remount of its own.
    assert_eq!(in_view("cat first.txt").stdout, "first\n");
    in_view("echo second > second.txt").assert_ok("write in the container's view");
    assert_eq!(fs::read(p.src.join("README")).unwrap(), b"hello\n");
    assert!(
        !p.src.join("first.txt").exists(),
        "staged work reached SOURCE"
    );
    // A second sidecar while the first serves (not staging: the staging area's lock would
    // stop it first): refused, it exits; the first serves on, its control socket too.
    let log2 = sidecar_that_exits(&p, &["--control", control.to_str().unwrap()], "second");
    assert!(
        log2.contains("the mounter refused this daemon: another sidecar serves"),
        "{log2}"
    );
    // One with the same staging area stops at its lock, before it binds anything.
    let log3 = sidecar_that_exits(&p, &staged, "third");
    assert!(log3.contains("is in use by another fencefs"), "{log3}");
    assert_eq!(p.sh("cat second.txt").stdout, "second\n");
    let st = run_fencefs(
        ["stage", "status", control.to_str().unwrap()],
        Duration::from_secs(30),
    );
    assert_eq!(
        st.stdout, "M README\nA first.txt\nA second.txt\n",
        "{}",
        st.stderr
    );
    // Unpublish detaches the live mount and the dead one beneath, and the sidecar ends.
    n.unpublish(&p).unwrap();
    assert!(mount_fstype(&p.target).is_none(), "mount left behind");
    assert!(!p.target.exists());
    let mut c = p.sidecar.take().unwrap();
    let done = eventually(Duration::from_secs(10), || {
        matches!(c.try_wait(), Ok(Some(_)))
    });
    assert!(done, "sidecar still running after unpublish");
}

#[test]
fn only_root_can_refuse_a_waiting_sidecar() {
    let mut n = Node::start("csi-refuse-uid");
    let mut p = n.pod("pod-u");
    workspace(&p);
    p.start_sidecar(&[]);
    assert!(
        eventually(Duration::from_secs(10), || p.sock.exists()),
        "{}",
        p.sidecar_log()
    );
    // The pod's uid (the agent, were it given the emptyDir) sends the driver's refusal.
    // (From the socket's directory: its full path is longer than a socket address.)
    let o = sh_as(
        UID,
        p.sock.parent().unwrap(),
        "/usr/bin/python3 -c 'import socket; s = socket.socket(socket.AF_UNIX); \
         s.connect(\"fencefs.sock\"); s.sendall(b\"fencefs-fuse-fd/1 refused: go away\\n\"); \
         print(s.recv(200).decode())'",
    );
    assert!(
        o.stdout
            .contains("error: a refusal from a process that is not root"),
        "{o:?}"
    );
    // The sidecar still waits, and takes the driver's descriptor.
    n.publish(&p, ATTRS).unwrap();
    p.wait_served();
    n.unpublish(&p).unwrap();
    assert!(mount_fstype(&p.target).is_none());
}

#[test]
fn unpublish_while_the_sidecar_is_dead_stops_the_resumption() {
    let mut n = Node::start("csi-resume-gone");
    let mut p = n.pod("pod-g");
    workspace(&p);
    n.publish(&p, ATTRS).unwrap();
    p.start_sidecar(&[]);
    p.wait_served();
    p.kill_sidecar();
    let dead = eventually(Duration::from_secs(10), || {
        driver_log(&n).contains("the sidecar that served it is gone")
    });
    assert!(dead, "driver log:\n{}", driver_log(&n));
    n.unpublish(&p).unwrap();
    assert!(mount_fstype(&p.target).is_none(), "mount left behind");
    // A sidecar that comes after the unpublish gets nothing mounted for it.
    fs::create_dir_all(&p.target).unwrap();
    p.start_sidecar(&[]);
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        mount_fstype(&p.target).is_none(),
        "mounted after the unpublish"
    );
    assert!(
        !driver_log(&n).contains("resume 1 of"),
        "{}",
        driver_log(&n)
    );
    p.kill_sidecar();
    fs::remove_dir(&p.target).unwrap();
}

#[test]
fn bad_requests_get_exact_codes() {
    let mut n = Node::start("csi-bad");
    let p = n.pod("pod-b");
    let with = |drop: &str, extra: &[(&'static str, &'static str)]| {
        let mut v: Vec<(&str, &str)> = ATTRS.iter().copied().filter(|(k, _)| *k != drop).collect();
        v.extend_from_slice(extra);
        v
    };
    let cases: Vec<(Vec<(&str, &str)>, &str)> = vec![
        (with("uid", &[]), "'uid' is missing"),
        (with("socketVolume", &[]), "'socketVolume' is missing"),
        (with("uid", &[("uid", "0")]), "must not run as root"),
        (with("gid", &[("gid", "abc")]), "'gid' is 'abc'"),
        (with("", &[("polciy", "x")]), "'polciy' is unknown"),
        (with("", &[("socket", "../../x")]), "single name"),
    ];
    for (ctx, want) in cases {
        let (c, msg) = code(n.publish(&p, &ctx));
        assert_eq!(c, tonic::Code::InvalidArgument, "{want}: {msg}");
        assert!(msg.contains(want), "{want}: {msg}");
        assert!(
            mount_fstype(&p.target).is_none(),
            "mounted on a bad request"
        );
    }
    // No capability, a block device, no target, a target not shaped as the kubelet's.
    let base = csi::NodePublishVolumeRequest {
        volume_id: "v".into(),
        target_path: p.target.display().to_string(),
        volume_capability: Some(mount_cap()),
        volume_context: ATTRS
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<HashMap<_, _>>(),
        ..Default::default()
    };
    let mut bad = vec![];
    let mut r = base.clone();
    r.volume_capability = None;
    bad.push((r, "volume_capability is missing"));
    let mut r = base.clone();
    r.volume_capability = Some(csi::VolumeCapability {
        access_type: Some(csi::volume_capability::AccessType::Block(
            csi::volume_capability::BlockVolume {},
        )),
        access_mode: None,
    });
    bad.push((r, "block device"));
    let mut r = base.clone();
    r.target_path = String::new();
    bad.push((r, "target_path is missing"));
    let mut r = base.clone();
    r.target_path = n.root.join("elsewhere/mount").display().to_string();
    bad.push((r, "not a kubelet CSI volume path"));
    let mut r = base.clone();
    r.volume_id = String::new();
    bad.push((r, "volume_id is missing"));
    for (r, want) in bad {
        let e = n.rt.block_on(n.node.node_publish_volume(r)).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{want}: {e:?}");
        assert!(e.message().contains(want), "{want}: {}", e.message());
    }
    let e =
        n.rt.block_on(
            n.node
                .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
                    volume_id: "v".into(),
                    target_path: String::new(),
                }),
        )
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    let e =
        n.rt.block_on(
            n.node
                .node_stage_volume(csi::NodeStageVolumeRequest::default()),
        )
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unimplemented);
}

#[test]
fn a_sidecar_that_never_comes_fails_closed_and_says_so() {
    let mut n = Node::start("csi-nosidecar");
    let p = n.pod("pod-n");
    workspace(&p);
    let mut ctx = ATTRS.to_vec();
    ctx.push(("handoverTimeout", "1"));
    n.publish(&p, &ctx).unwrap();
    // After the timeout, the next publish (requiresRepublish) reports it.
    let mut last = (tonic::Code::Ok, String::new());
    let failed = eventually(Duration::from_secs(10), || {
        last = code(n.publish(&p, &ctx));
        last.0 != tonic::Code::Ok
    });
    assert!(failed, "no failure reported");
    assert_eq!(last.0, tonic::Code::DeadlineExceeded, "{}", last.1);
    assert!(
        last.1
            .contains("no sidecar took the FUSE descriptor within 1 s"),
        "{}",
        last.1
    );
    assert!(last.1.contains("fencefs.sock"), "{}", last.1);
    // Failed closed: the mount is there but dead, never a plain directory.
    let o = p.sh("ls");
    assert!(!o.ok(), "the unserved volume answered");
    n.unpublish(&p).unwrap();
    assert!(mount_fstype(&p.target).is_none());
}

#[test]
fn an_unprivileged_sidecar_stages() {
    let mut n = Node::start("csi-stage");
    let mut p = n.pod("pod-s");
    workspace(&p);
    let stage = p.pvc.join("stage");
    n.publish(&p, ATTRS).unwrap();
    p.start_sidecar(&["--stage", stage.to_str().unwrap()]);
    p.wait_served();
    let before = snapshot(&p.src);
    p.sh("echo staged > new.txt && echo more >> README")
        .assert_ok("writes through the staged mount");
    assert_eq!(p.sh("cat new.txt").stdout, "staged\n");
    assert_host_unchanged(&before, &p.src, "an unprivileged sidecar's staged writes");
    let st = run_fencefs(
        ["stage", "status", "--dir", stage.to_str().unwrap()],
        Duration::from_secs(30),
    );
    assert_eq!(st.stdout, "M README\nA new.txt\n", "{}", st.stderr);
    p.kill_sidecar();
    n.unpublish(&p).unwrap();
    assert!(mount_fstype(&p.target).is_none());
}

/// The kubelet's ConfigMap update, exactly: a new timestamped directory, a `..data_tmp`
/// symlink to it renamed over `..data`; `policy.toml` is `..data/policy.toml`.
fn configmap_write(dir: &Path, stamp: &str, policy: &str) {
    let ts = dir.join(stamp);
    fs::create_dir(&ts).unwrap();
    fs::write(ts.join("policy.toml"), policy).unwrap();
    let tmp = dir.join("..data_tmp");
    symlink(stamp, &tmp).unwrap();
    fs::rename(&tmp, dir.join("..data")).unwrap();
}

#[test]
fn configmap_swap_reloads_and_a_bad_update_keeps_the_policy() {
    let mut n = Node::start("csi-configmap");
    let mut p = n.pod("pod-c");
    workspace(&p);
    let cm = n.root.join("pod-c-configmap");
    mkdirp(&cm);
    configmap_write(&cm, "..2026_12_06_01_00_00.000000001", POLICY);
    symlink("..data/policy.toml", cm.join("policy.toml")).unwrap();
    p.policy = cm.join("policy.toml");
    let audit = p.pvc.join("audit.jsonl");
    n.publish(&p, ATTRS).unwrap();
    p.start_sidecar(&["--watch-policy", "--audit", audit.to_str().unwrap()]);
    p.wait_served();
    p.sh("cat docs/guide.md").assert_ok("docs readable");
    // docs becomes hidden.
    let hide_docs = format!("{POLICY}\n[[rule]]\npath = \"docs/guide.md\"\naccess = \"none\"\n");
    configmap_write(&cm, "..2026_12_06_01_01_00.000000002", &hide_docs);
    let hidden = eventually(Duration::from_secs(10), || {
        p.sh("cat docs/guide.md").stderr.contains("No such file")
    });
    assert!(hidden, "not reloaded; log:\n{}", p.sidecar_log());
    // An invalid update: the old policy stays, the log and the audit say so.
    configmap_write(
        &cm,
        "..2026_12_06_01_02_00.000000003",
        "mode = \"nonsense\"\n",
    );
    let said = eventually(Duration::from_secs(10), || {
        p.sidecar_log()
            .contains("reload refused, old policy stays in force")
    });
    assert!(said, "{}", p.sidecar_log());
    let o = p.sh("cat docs/guide.md");
    assert!(
        o.stderr.contains("No such file"),
        "old policy gone: {}",
        o.stderr
    );
    let a = fs::read_to_string(&audit).unwrap_or_default();
    assert!(a.contains("reload"), "audit: {a}");
    n.unpublish(&p).unwrap();
    assert!(mount_fstype(&p.target).is_none());
}

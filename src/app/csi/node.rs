//! The CSI Identity and Node services (inline ephemeral volumes only): what the kubelet
//! calls. NodePublishVolume checks the request, mounts a fresh `/dev/fuse` at the target
//! (`nosuid,nodev,fd=N`, the volume's uid/gid, shared) and gives the volume to the
//! hand-over supervisor (`handover`: the sidecar, and a restarted sidecar, get it);
//! NodeUnpublishVolume ends the volume there, detaches every fencefs mount stacked at the
//! target (a resumed volume has the dead ones beneath) and removes the target directory.
//!
//! Invariants: publish and unpublish are idempotent (a repeated publish of the same volume
//! at the same target answers as the first did, or with the hand-over's failure; an
//! unpublish of what is not there succeeds); the mount table is read, never the target
//! (a FUSE mount nobody serves would hang or refuse a stat); only a `fuse.fencefs` mount
//! is ever unmounted; every refusal is a gRPC status whose message names what was wrong.
//! The volume table's lock is never held across a blocking call but the mount syscalls
//! (a volume's own lock, which a hand-over holds for a sidecar's answer, is taken after
//! the table's is released).

// tonic's `Status` is what every gRPC method returns: boxing it here would only be
// unboxed again at the service boundary.
#![allow(clippy::result_large_err)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bpfman_csi::v1 as csi;
use parking_lot::Mutex;
use tonic::{Request, Response, Status};

use super::attrs::{self, Attrs};
use super::handover::{self, Outcome, Slot, Supervisor};

/// One published volume.
struct Volume {
    volume_id: String,
    context: HashMap<String, String>,
    readonly: bool,
    slot: Arc<Slot>,
}

/// The driver: its name and node, and the volumes it published since it started.
pub struct Driver {
    pub name: String,
    pub node_id: String,
    volumes: Mutex<HashMap<PathBuf, Volume>>,
    supervisor: Supervisor,
}

impl Driver {
    /// The driver, its hand-over supervisor's thread started.
    pub fn new(name: String, node_id: String) -> Result<Driver, String> {
        let supervisor =
            Supervisor::start().map_err(|e| format!("cannot start the hand-over thread: {e}"))?;
        Ok(Driver {
            name,
            node_id,
            volumes: Mutex::new(HashMap::new()),
            supervisor,
        })
    }
}

fn mount_type(target: &Path) -> Option<String> {
    super::super::mount::mount_type_at(target)
}

fn invalid(msg: impl Into<String>) -> Status {
    Status::invalid_argument(msg)
}

/// The target path: present and absolute.
fn target_of(path: &str) -> Result<PathBuf, Status> {
    if path.is_empty() {
        return Err(invalid("target_path is missing"));
    }
    let p = PathBuf::from(path);
    if !p.is_absolute() {
        return Err(invalid(format!("target_path '{path}' is not absolute")));
    }
    Ok(p)
}

/// Checks a publish request; gives the target and the volume's attributes.
fn check_publish(r: &csi::NodePublishVolumeRequest) -> Result<(PathBuf, Attrs), Status> {
    if r.volume_id.is_empty() {
        return Err(invalid("volume_id is missing"));
    }
    let target = target_of(&r.target_path)?;
    let cap = r
        .volume_capability
        .as_ref()
        .ok_or_else(|| invalid("volume_capability is missing"))?;
    match cap.access_type {
        Some(csi::volume_capability::AccessType::Mount(_)) => {}
        Some(csi::volume_capability::AccessType::Block(_)) => {
            return Err(invalid(
                "volume_capability is a block device: fencefs volumes are file systems",
            ));
        }
        None => return Err(invalid("volume_capability has no access type")),
    }
    if r.volume_context.get("csi.storage.k8s.io/ephemeral") == Some(&"false".to_string()) {
        return Err(invalid(
            "fencefs volumes are inline ephemeral volumes only (csi: in the pod's volumes)",
        ));
    }
    let a = attrs::parse(&r.volume_context).map_err(invalid)?;
    Ok((target, a))
}

impl Driver {
    fn publish(&self, r: csi::NodePublishVolumeRequest) -> Result<(), Status> {
        let (target, a) = check_publish(&r)?;
        let dir = attrs::socket_dir(&target, &a).map_err(invalid)?;
        let mut vols = self.volumes.lock();
        if let Some(v) = vols.get(&target) {
            if v.volume_id != r.volume_id
                || v.context != r.volume_context
                || v.readonly != r.readonly
            {
                return Err(Status::already_exists(format!(
                    "target '{}' is published already with volume '{}' and other attributes",
                    target.display(),
                    v.volume_id
                )));
            }
            let slot = v.slot.clone();
            drop(vols);
            return match slot.outcome() {
                Outcome::Failed(e) => Err(Status::deadline_exceeded(e)),
                Outcome::Fine => Ok(()),
            };
        }
        if mount_type(&target).is_some_and(|t| t == "fuse.fencefs") {
            // Published before this driver restarted: the mount is there, keep it.
            return Ok(());
        }
        match std::fs::create_dir(&target) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                return Err(Status::internal(format!(
                    "cannot create target '{}': {e}",
                    target.display()
                )));
            }
            _ => {}
        }
        let fsname = format!("fencefs:{}", r.volume_id.replace([',', '\\', ' '], "_"));
        let dev =
            handover::mount_fresh(&target, &fsname, &a, r.readonly).map_err(Status::internal)?;
        log::info!(
            "published volume {} at {} (uid {}, gid {}); handing it to {}",
            r.volume_id,
            target.display(),
            a.uid,
            a.gid,
            dir.join(&a.socket).display()
        );
        let slot = Arc::new(Slot::new(dev, dir, target.clone(), &a, fsname, r.readonly));
        self.supervisor.add(slot.clone());
        vols.insert(
            target,
            Volume {
                volume_id: r.volume_id,
                context: r.volume_context,
                readonly: r.readonly,
                slot,
            },
        );
        Ok(())
    }

    fn unpublish(&self, r: csi::NodeUnpublishVolumeRequest) -> Result<(), Status> {
        if r.volume_id.is_empty() {
            return Err(invalid("volume_id is missing"));
        }
        let target = target_of(&r.target_path)?;
        let v = self.volumes.lock().remove(&target);
        if let Some(v) = v {
            v.slot.close();
        }
        // Detach every fencefs mount stacked there: a resumed volume has its dead mounts
        // beneath the live one.
        while mount_type(&target).is_some_and(|t| t == "fuse.fencefs") {
            crate::host::sys::ns::detach(&target).map_err(|e| {
                Status::internal(format!("cannot unmount '{}': {e}", target.display()))
            })?;
        }
        if let Some(t) = mount_type(&target) {
            return Err(Status::failed_precondition(format!(
                "'{}' has a {t} mount that is not fencefs's: left alone",
                target.display()
            )));
        }
        match std::fs::remove_dir(&target) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Status::internal(format!(
                "cannot remove target '{}': {e}",
                target.display()
            ))),
            _ => {
                log::info!("unpublished volume {} at {}", r.volume_id, target.display());
                Ok(())
            }
        }
    }
}

/// The gRPC services over one [`Driver`].
#[derive(Clone)]
pub struct Service(pub Arc<Driver>);

#[tonic::async_trait]
impl csi::identity_server::Identity for Service {
    async fn get_plugin_info(
        &self,
        _: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: self.0.name.clone(),
            vendor_version: env!("CARGO_PKG_VERSION").into(),
            manifest: HashMap::new(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        // Node service only: no CONTROLLER_SERVICE, no topology.
        Ok(Response::new(csi::GetPluginCapabilitiesResponse {
            capabilities: Vec::new(),
        }))
    }

    async fn probe(
        &self,
        _: Request<csi::ProbeRequest>,
    ) -> Result<Response<csi::ProbeResponse>, Status> {
        let ready = std::path::Path::new("/dev/fuse").exists();
        Ok(Response::new(csi::ProbeResponse { ready: Some(ready) }))
    }
}

#[tonic::async_trait]
impl csi::node_server::Node for Service {
    async fn node_stage_volume(
        &self,
        _: Request<csi::NodeStageVolumeRequest>,
    ) -> Result<Response<csi::NodeStageVolumeResponse>, Status> {
        Err(Status::unimplemented(
            "NodeStageVolume: fencefs has no STAGE_UNSTAGE_VOLUME",
        ))
    }

    async fn node_unstage_volume(
        &self,
        _: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Result<Response<csi::NodeUnstageVolumeResponse>, Status> {
        Err(Status::unimplemented(
            "NodeUnstageVolume: fencefs has no STAGE_UNSTAGE_VOLUME",
        ))
    }

    async fn node_publish_volume(
        &self,
        r: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        let d = self.0.clone();
        let r = r.into_inner();
        blocking(move || d.publish(r)).await?;
        Ok(Response::new(csi::NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        r: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        let d = self.0.clone();
        let r = r.into_inner();
        blocking(move || d.unpublish(r)).await?;
        Ok(Response::new(csi::NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        _: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<csi::NodeGetVolumeStatsResponse>, Status> {
        Err(Status::unimplemented(
            "NodeGetVolumeStats: fencefs has no GET_VOLUME_STATS",
        ))
    }

    async fn node_expand_volume(
        &self,
        _: Request<csi::NodeExpandVolumeRequest>,
    ) -> Result<Response<csi::NodeExpandVolumeResponse>, Status> {
        Err(Status::unimplemented(
            "NodeExpandVolume: fencefs volumes have no size",
        ))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
        // Publish and unpublish only (always offered): no capability to announce.
        Ok(Response::new(csi::NodeGetCapabilitiesResponse {
            capabilities: Vec::new(),
        }))
    }

    async fn node_get_info(
        &self,
        _: Request<csi::NodeGetInfoRequest>,
    ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
        Ok(Response::new(csi::NodeGetInfoResponse {
            node_id: self.0.node_id.clone(),
            max_volumes_per_node: 0,
            accessible_topology: None,
        }))
    }
}

/// Runs `f` (mount syscalls, the volume table) off the runtime's thread.
async fn blocking(f: impl FnOnce() -> Result<(), Status> + Send + 'static) -> Result<(), Status> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Status::internal(format!("request task failed: {e}")))?
}

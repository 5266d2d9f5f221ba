use super::*;

/// A resize left undone (memory in use above a lowered limit): the limits
/// the cgroups still have, which containers changed, and when to try again.
pub(super) struct ResizeRetry {
    applied: Box<Pod>,
    resized: Vec<usize>,
    pub(super) at: Instant,
}

/// How often a resize left undone is tried again.
pub(super) const RESIZE_RETRY: Duration = Duration::from_secs(10);

impl Worker {
    /// As upstream: a container whose image changed is stopped (stop
    /// signal, SIGKILL after the grace period) and started with the new
    /// image; labels and annotations reach the downward API volumes.
    pub(super) async fn on_update(&mut self, pod: Pod) {
        let name = self.pod.full_name();
        let names = |p: &Pod| {
            p.all_containers()
                .map(|c| c.name.clone())
                .collect::<Vec<_>>()
        };
        let same_containers = names(&pod) == names(&self.pod)
            && pod.init_containers.len() == self.pod.init_containers.len();
        // Ephemeral containers are only ever added, as the API server
        // allows, but a patch may list them in another order: the worker
        // keeps its own, the new ones last.
        let mut pod = pod;
        let mut ordered = Vec::with_capacity(pod.ephemeral_containers.len());
        for known in &self.pod.ephemeral_containers {
            match pod.ephemeral_containers.iter().position(|c| c == known) {
                Some(at) => ordered.push(pod.ephemeral_containers.remove(at)),
                None => break,
            }
        }
        if !same_containers || ordered.len() != self.pod.ephemeral_containers.len() {
            log::warn!("pod {name}: its containers changed in the API server; ignoring");
            return;
        }
        let added = std::mem::replace(&mut pod.ephemeral_containers, ordered);
        pod.ephemeral_containers.extend(added.iter().cloned());
        let old = std::mem::replace(&mut self.pod, pod);
        self.volumes_written = None;
        let now = Instant::now();
        let known = self.containers.len();
        for c in &added {
            log::info!("pod {name}: ephemeral container {} added", c.name);
            self.containers.push(ContainerState::of(c, &[]));
        }
        let mut resized = Vec::new();
        for i in 0..known {
            let image = self.pod.container(i).image.clone();
            if old.container(i).image == image {
                let (before, after) = (
                    &old.container(i).resources,
                    &self.pod.container(i).resources,
                );
                let changed = [
                    (
                        "cpu",
                        (before.cpu_request_milli, before.cpu_limit_milli)
                            != (after.cpu_request_milli, after.cpu_limit_milli),
                    ),
                    (
                        "memory",
                        (before.memory_request, before.memory_limit)
                            != (after.memory_request, after.memory_limit),
                    ),
                ];
                let restart = changed.iter().any(|(resource, changed)| {
                    *changed
                        && self
                            .pod
                            .container(i)
                            .restart_on_resize
                            .iter()
                            .any(|r| r == resource)
                });
                if changed.iter().any(|(_, changed)| *changed) && !restart {
                    resized.push(i);
                    continue;
                }
                if !restart {
                    continue;
                }
            }
            let c = &mut self.containers[i];
            c.record.view.image = image;
            c.restart_for_update = true;
            c.retry_at = None;
            c.setup_failed_at = None;
            let running = c.record.view.terminated.is_none();
            let Some(id) = c.record.view.container_id.clone().filter(|_| running) else {
                continue;
            };
            let signal = c.record.stop_signal();
            c.kill_at = Some(now + self.pod.termination_grace);
            let container = c.record.view.name.clone();
            let message = format!("Container {container} definition changed, will be restarted");
            self.event(Some(&container), EventType::Normal, "Killing", message);
            if let Err(e) = self.ctx.runtime.kill(&id, &signal).await {
                log::warn!("pod {name}: {e}");
            }
        }
        // A resize still undone: the cgroups hold its older limits.
        let undone = self.resize_retry.is_some();
        let (applied, resized) = match self.resize_retry.take() {
            Some(retry) => {
                let mut all = retry.resized;
                all.extend(resized);
                all.sort_unstable();
                all.dedup();
                (*retry.applied, all)
            }
            None => (old, resized),
        };
        if crate::agent::resized(&applied, &self.pod) {
            self.resize_in_place(&applied, &resized).await;
        } else if undone {
            // Resized back to what the cgroups hold: nothing is undone.
            self.resize.error = None;
        }
        let checkpoint = Checkpoint {
            uid: self.pod.uid.clone(),
            source: self.pod.source.clone(),
            admitted: self.admitted,
            manifest: self.pod.manifest.clone(),
        };
        let dir = self.dir.clone();
        if let Err(e) =
            crate::helpers::unblock(move || records::write_checkpoint(&dir, &checkpoint)).await
        {
            log::error!("pod {name}: {e}");
        }
        self.save_containers();
    }

    /// Actuates an in-place resize in the cgroup files: the pod's cgroup
    /// first at the larger of its old and new limits, then the running
    /// containers `resized`, then the pod's at its new limits, so that no
    /// step has a container above its pod. Off the loop: lowering
    /// memory.max makes the kernel reclaim before the write returns.
    pub(super) async fn resize_in_place(&mut self, old: &Pod, resized: &[usize]) {
        self.resize.pending = None;
        let pids = self.ctx.config.pod_pids_limit;
        let (before, after) = (
            crate::cgroup::pod_limits(old, pids),
            crate::cgroup::pod_limits(&self.pod, pids),
        );
        let larger = crate::cgroup::Limits {
            cpu_shares: before.cpu_shares.max(after.cpu_shares),
            cpu_quota: before.cpu_quota.zip(after.cpu_quota).map(|(a, b)| a.max(b)),
            memory_max: before
                .memory_max
                .zip(after.memory_max)
                .map(|(a, b)| a.max(b)),
            pids_max: after.pids_max,
        };
        // The running ones: (index, cgroup path, new limits).
        let containers: Vec<(usize, String, crate::cgroup::Limits)> = resized
            .iter()
            .filter_map(|&i| {
                let view = &self.containers[i].record.view;
                let id = view
                    .container_id
                    .as_ref()
                    .filter(|_| view.terminated.is_none())?;
                let r = &self.pod.container(i).resources;
                let limits = crate::cgroup::Limits {
                    cpu_shares: crate::cgroup::cpu_shares(r.cpu_request_milli),
                    cpu_quota: r.cpu_limit_milli.map(crate::cgroup::cpu_quota),
                    memory_max: r.memory_limit,
                    pids_max: None,
                };
                Some((
                    i,
                    self.ctx
                        .cgroups
                        .container_path(self.pod.qos, &self.pod.uid, id),
                    limits,
                ))
            })
            .collect();
        // A limit lowered below what is in use would have the kernel
        // reclaim or OOM-kill at once: upstream leaves such a resize
        // undone and tries again.
        let lowered =
            |old: Option<u64>, new: Option<u64>| new.filter(|n| old.is_none_or(|o| *n < o));
        let pod_check = lowered(before.memory_max, after.memory_max);
        let container_checks: Vec<(String, String, u64)> = containers
            .iter()
            .filter_map(|(i, path, limits)| {
                let i = *i;
                let limit = lowered(old.container(i).resources.memory_limit, limits.memory_max)?;
                Some((self.pod.container(i).name.clone(), path.clone(), limit))
            })
            .collect();
        let cgroups = self.ctx.cgroups.clone();
        let (qos, uid, pod_name) = (self.pod.qos, self.pod.uid.clone(), self.pod.name.clone());
        let applied = crate::helpers::unblock(move || {
            let version = cgroups.version;
            let in_use = |path: &str, limit: u64| {
                crate::cgroup::usage::read(version, path).is_some_and(|u| u.memory_bytes >= limit)
            };
            if let Some(limit) = pod_check
                && in_use(&cgroups.pod_path(qos, &uid), limit)
            {
                return Err(format!(
                    "aborting attempt to set pod memory limit less than current memory usage for pod {pod_name}"
                ));
            }
            for (container, path, limit) in &container_checks {
                if in_use(path, *limit) {
                    return Err(format!(
                        "aborting attempt to set container memory limit less than current memory usage for container {container}"
                    ));
                }
            }
            let write = || -> Result<(), crate::cgroup::CgroupError> {
                cgroups.ensure_pod(qos, &uid, &larger)?;
                for (_, path, limits) in &containers {
                    crate::cgroup::ensure_limits(version, path, limits)?;
                }
                cgroups.ensure_pod(qos, &uid, &after)
            };
            write().map_err(|e| e.to_string())
        })
        .await;
        let name = self.pod.full_name();
        match applied {
            Ok(()) => {
                log::info!("pod {name}: resized in place");
                self.resize.error = None;
                self.resize_retry = None;
            }
            Err(e) => {
                log::warn!("pod {name}: resizing: {e}");
                self.resize.error = Some(e);
                self.resize_retry = Some(ResizeRetry {
                    applied: Box::new(old.clone()),
                    resized: resized.to_vec(),
                    at: Instant::now() + RESIZE_RETRY,
                });
            }
        }
    }

    /// Tries a resize left undone again, when it is time.
    pub(super) async fn retry_resize(&mut self, now: Instant) {
        if self.resize_retry.as_ref().is_none_or(|r| r.at > now) {
            return;
        }
        if let Some(retry) = self.resize_retry.take() {
            self.resize_in_place(&retry.applied, &retry.resized).await;
        }
    }
}

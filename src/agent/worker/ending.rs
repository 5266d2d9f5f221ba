use super::*;

/// How often emptyDir sizeLimits are checked: upstream's eviction interval.
pub(super) const STORAGE_CHECK: Duration = Duration::from_secs(10);

/// Upstream's message for a pod past its activeDeadlineSeconds.
pub(super) const DEADLINE_EXCEEDED: &str =
    "Pod was active on the node longer than the specified deadline";

impl Worker {
    /// The pod's disk emptyDirs with a sizeLimit: (name, dir, limit bytes,
    /// limit as written).
    pub(super) fn limited_volumes(&self) -> Vec<(String, PathBuf, u64, String)> {
        let written = |name: &str| -> String {
            self.pod
                .manifest
                .spec
                .as_ref()
                .and_then(|s| s.volumes.as_ref())
                .and_then(|v| v.iter().find(|v| v.name == name))
                .and_then(|v| v.empty_dir.as_ref())
                .and_then(|e| e.size_limit.as_ref())
                .map(|q| q.0.clone())
                .unwrap_or_default()
        };
        self.pod
            .volumes
            .iter()
            .filter_map(|v| match v.source {
                VolumeSource::EmptyDir {
                    memory: false,
                    size_limit: Some(limit),
                } => Some((
                    v.name.clone(),
                    self.dir.join("volumes").join(&v.name),
                    limit,
                    written(&v.name),
                )),
                _ => None,
            })
            .collect()
    }

    /// Upstream's local storage eviction for emptyDir sizeLimits: a pod
    /// whose disk emptyDir holds more than its limit is evicted. As
    /// upstream, only active pods, and never critical ones (static pods and
    /// system priorities), which would not be admitted again.
    pub(super) async fn check_local_storage(&mut self) {
        let now = Instant::now();
        if !self.stage.may_end()
            || self.storage_measuring
            || self.storage_check_at.is_some_and(|t| t > now)
        {
            return;
        }
        let critical = crate::agent::eviction::is_critical(&self.pod);
        if critical || self.phase_is_terminal() {
            return;
        }
        let volumes = self.limited_volumes();
        let any_container_limit = self
            .pod
            .all_containers()
            .any(|c| c.resources.ephemeral_limit.is_some());
        // Checked on a timer from admission on: the containers with a
        // limit may not have started yet.
        if volumes.is_empty() && !any_container_limit {
            return;
        }
        // The pod's own limit: its containers' together, as upstream's
        // PodLimits counts them (init containers at their peak).
        let pod_limit = any_container_limit.then(|| {
            self.pod
                .pod_total(|c| c.resources.ephemeral_limit.unwrap_or(0))
        });
        // Without a container limit there is nothing else to add up.
        let (containers, disk_volumes) = if any_container_limit {
            let disk_volumes: Vec<PathBuf> = self
                .pod
                .volumes
                .iter()
                .filter(|v| matches!(v.source, VolumeSource::EmptyDir { memory: false, .. }))
                .map(|v| self.dir.join("volumes").join(&v.name))
                .collect();
            (self.limited_containers(), disk_volumes)
        } else {
            (Vec::new(), Vec::new())
        };
        self.storage_check_at = Some(now + STORAGE_CHECK);
        self.storage_measuring = true;
        let verdicts = self.storage_verdicts.0.clone();
        let pod = self.pod.full_name();
        crate::rt::spawn(async move {
            let measure = |dir: PathBuf| {
                let pod = pod.clone();
                async move {
                let shown = dir.display().to_string();
                match crate::helpers::unblock(move || crate::runtime::disk_usage::disk_usage(&dir))
                    .await
                {
                    Ok(used) => Some(used),
                    // Not made yet (the sandbox comes with the first start).
                    Err(e) if e.source == nix::errno::Errno::ENOENT => None,
                    Err(e) => {
                        log::warn!("pod {pod}: measuring {shown}: {e}");
                        None
                    }
                }
                }
            };
            let mut verdict = None;
            // In upstream's order: emptyDir limits, the pod's, each
            // container's.
            for (name, dir, limit, written) in volumes {
                if measure(dir).await.is_some_and(|used| used > limit) {
                    verdict = Some(format!(
                        "Usage of EmptyDir volume {name:?} exceeds the limit {written:?}. "
                    ));
                    break;
                }
            }
            if verdict.is_none() {
                let mut pod_used = 0;
                for dir in disk_volumes {
                    pod_used += measure(dir).await.unwrap_or(0);
                }
                let mut over = None;
                for (name, limit, written, dirs) in containers {
                    let mut used = 0;
                    for dir in dirs {
                        used += measure(dir).await.unwrap_or(0);
                    }
                    pod_used += used;
                    if over.is_none() && limit.is_some_and(|l| used > l) {
                        over = Some(format!(
                            "Container {name} exceeded its local ephemeral storage limit {written:?}. "
                        ));
                    }
                }
                verdict = match pod_limit {
                    Some(limit) if pod_used > limit => Some(format!(
                        "Pod ephemeral local storage usage exceeds the total limit of containers {}. ",
                        crate::quantity::format_bytes(limit)
                    )),
                    _ => over,
                };
            }
            let _ = verdicts.send(verdict).await;
        })
        .detach();
    }

    /// The started instances of a pod's containers: (name, its
    /// ephemeral-storage limit, as written, its writable layer and log
    /// dir).
    pub(super) fn limited_containers(&self) -> Vec<(String, Option<u64>, String, Vec<PathBuf>)> {
        let written = |name: &str| -> String {
            let spec = self.pod.manifest.spec.as_ref();
            spec.into_iter()
                .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
                .find(|c| c.name == name)
                .and_then(|c| {
                    c.resources
                        .as_ref()?
                        .limits
                        .as_ref()?
                        .get("ephemeral-storage")
                })
                .map(|q| q.0.clone())
                .unwrap_or_default()
        };
        let logs = self.ctx.config.pod_logs_dir.join(self.pod.log_dir_name());
        self.containers
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                let id = c.record.view.container_id.as_ref()?;
                let spec = self.pod.container(i);
                let upper = Bundle::new(&self.dir, id).dir.join("upper");
                Some((
                    spec.name.clone(),
                    spec.resources.ephemeral_limit,
                    written(&spec.name),
                    vec![upper, logs.join(&spec.name)],
                ))
            })
            .collect()
    }

    /// Ends the pod for good, as upstream's eviction manager does: its
    /// containers are stopped within `grace` (killed at once for a hard
    /// threshold) and it fails with reason Evicted.
    pub(super) async fn evict(&mut self, message: String, grace: Duration) {
        self.event(None, EventType::Warning, "Evicted", message.clone());
        let ended = Ended {
            reason: "Evicted".into(),
            message,
        };
        self.end(ended, grace).await;
    }

    /// When the pod's activeDeadlineSeconds have passed since it was
    /// admitted (its startTime).
    pub(super) fn active_deadline(&self) -> Option<Instant> {
        let deadline = self.pod.active_deadline?;
        Some(Instant::now() + deadline.saturating_sub(self.active_for()))
    }

    /// Whether the pod's activeDeadlineSeconds have passed.
    pub(super) fn past_active_deadline(&self) -> bool {
        self.pod
            .active_deadline
            .is_some_and(|deadline| self.active_for() >= deadline)
    }

    fn active_for(&self) -> Duration {
        active_between(self.admitted, Timestamp::now())
    }

    /// Past its active deadline, a pod is ended as upstream's kubelet ends
    /// it: its containers get their grace period, and it fails with reason
    /// DeadlineExceeded.
    pub(super) async fn end_past_deadline(&mut self) {
        let message = DEADLINE_EXCEEDED.to_owned();
        self.event(None, EventType::Normal, "DeadlineExceeded", message.clone());
        let ended = Ended {
            reason: "DeadlineExceeded".into(),
            message,
        };
        let grace = self.pod.termination_grace;
        self.end(ended, grace).await;
    }

    /// Ends the pod for good, recorded in its dir so that no restart of
    /// the agent runs it again.
    pub(super) async fn end(&mut self, ended: Ended, grace: Duration) {
        let name = self.pod.full_name();
        log::warn!("pod {name}: {}: {}", ended.reason, ended.message);
        let marker = dir_evicted(&self.dir);
        let text = ended.to_text();
        if let Err(e) = crate::helpers::unblock(move || std::fs::write(&marker, text)).await {
            log::error!("pod {name}: recording its end: {e}");
        }
        self.stage.end(ended);
        if grace.is_zero() {
            self.kill_all_now().await;
        } else {
            self.stop_all_within(grace).await;
        }
        self.write_status();
    }

    /// The stop signal to every running instance, SIGKILL after `grace`
    /// (the pass enforces it), nothing started again.
    pub(super) async fn stop_all_within(&mut self, grace: Duration) {
        let kill_at = Instant::now() + grace;
        for i in 0..self.containers.len() {
            let c = &mut self.containers[i];
            c.probes.stop();
            c.retry_at = None;
            let Some(id) = c.record.view.container_id.clone() else {
                continue;
            };
            if c.record.view.terminated.is_some() {
                continue;
            }
            c.kill_at = Some(kill_at);
            let signal = c.record.stop_signal();
            if let Err(e) = self.ctx.runtime.kill(&id, &signal).await {
                log::warn!("pod {}: {e}", self.pod.full_name());
            }
        }
    }

    /// SIGKILL to every running instance, nothing started again: what an
    /// eviction does (also when an agent crashed halfway through one).
    pub(super) async fn kill_all_now(&mut self) {
        let name = self.pod.full_name();
        for c in &mut self.containers {
            c.probes.stop();
            c.retry_at = None;
            let running = c.record.view.terminated.is_none();
            if let Some(id) = c.record.view.container_id.clone().filter(|_| running)
                && let Err(e) = self.ctx.runtime.kill(&id, "KILL").await
            {
                log::warn!("pod {name}: {e}");
            }
        }
    }
}

/// How long a pod admitted at `admitted` has been active at `now`. A clock
/// set back (a board without a real-time clock boots in the past) makes it
/// zero, as upstream's negative duration never passes a deadline, not a
/// long time that would end the pod at once.
fn active_between(admitted: Timestamp, now: Timestamp) -> Duration {
    now.duration_since(admitted).try_into().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clock_set_back_never_passes_a_deadline() {
        let admitted: Timestamp = "2026-12-05T12:00:00Z".parse().unwrap();
        let later: Timestamp = "2026-12-05T12:00:30Z".parse().unwrap();
        assert_eq!(active_between(admitted, later), Duration::from_secs(30));
        // Booted in 1970 until NTP answers.
        assert_eq!(
            active_between(admitted, Timestamp::UNIX_EPOCH),
            Duration::ZERO
        );
    }
}

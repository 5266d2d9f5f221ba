use super::*;

/// How often a pod's cgroup removal is tried, 100 ms apart.
const CGROUP_REMOVAL_TRIES: u32 = 30;

/// Removes what a pod left on the host. Also used for pods whose checkpoint
/// cannot be read any more. Idempotent.
pub async fn remove_pod_state(
    ctx: &Context,
    dir: &Path,
    qos: crate::pod::QosClass,
    uid: &str,
    log_dir: &Path,
) {
    // Containers the runtime still knows under this pod's bundles.
    if let Ok(listed) = ctx.runtime.list().await {
        let containers_dir = dir.join("containers");
        for state in listed {
            if containers_dir.join(&state.id).is_dir() {
                let _ = Bundle::new(dir, &state.id)
                    .remove(&ctx.runtime, &state.id)
                    .await;
            }
        }
    }
    // Its monitor, if one still runs (a pod dir found without a usable
    // checkpoint): it would hold the dir's socket and run on, untracked.
    // A worker's own cleanup has shut it down already: nothing listens.
    let (unheard, _) = smol::channel::bounded(1);
    if let Ok(mut monitor) = monitor_client::connect(dir, unheard).await
        && let Err(e) = monitor.shutdown().await
    {
        log::warn!("pod {uid}: stopping its monitor: {e}");
    }
    if let Err(e) = sandbox::teardown(dir, &ctx.cni).await {
        log::warn!("pod {uid}: {e}");
    }
    // A pause process the teardown killed leaves its cgroup only once it
    // has exited, which the kernel may not have finished: tried again
    // for a while.
    let mut tries = 0;
    while let Err(e) = ctx.cgroups.remove_pod(qos, uid) {
        tries += 1;
        if tries == CGROUP_REMOVAL_TRIES {
            log::warn!("pod {uid}: {e}");
            break;
        }
        smol::Timer::after(Duration::from_millis(100)).await;
    }
    let (dir, log_dir) = (dir.to_owned(), log_dir.to_owned());
    let removed = crate::helpers::unblock(move || {
        crate::state::remove_tree(&log_dir)?;
        crate::state::remove_tree(&dir)
    })
    .await;
    if let Err(e) = removed {
        log::warn!("pod {uid}: {e}");
    }
}

impl Worker {
    /// Stops every container (stop signal, grace period, SIGKILL), then
    /// removes everything of the pod.
    pub(super) async fn terminate(&mut self) {
        let name = self.pod.full_name();
        let grace = match &self.stage {
            Stage::Terminating { grace, .. } => *grace,
            _ => self.pod.termination_grace,
        };
        log::info!("pod {name}: terminating (grace period {grace:?})");
        self.write_status();
        self.undo_unstarted().await;
        let running: Vec<(usize, String)> = self
            .containers
            .iter()
            .enumerate()
            .filter(|(_, c)| c.record.view.terminated.is_none())
            .filter_map(|(i, c)| c.record.view.container_id.clone().map(|id| (i, id)))
            .collect();
        let deadline = Instant::now() + grace;
        // Regular containers first, then sidecars in reverse order, all
        // within the one grace period.
        let is_sidecar = |i: usize| self.pod.container(i).role == ContainerRole::Sidecar;
        let (sidecars, others): (Vec<_>, Vec<_>) =
            running.iter().cloned().partition(|(i, _)| is_sidecar(*i));
        for (group, sidecars_too) in [(others, false), (sidecars, true)] {
            self.pre_stop(&group, deadline).await;
            for (i, id) in group.iter().rev() {
                let name = self.containers[*i].record.view.name.clone();
                self.event(
                    Some(&name),
                    EventType::Normal,
                    "Killing",
                    format!("Stopping container {name}"),
                );
                let signal = self.containers[*i].record.stop_signal();
                if let Err(e) = self.ctx.runtime.kill(id, &signal).await {
                    log::warn!("pod {name}: {e}");
                }
            }
            if !sidecars_too {
                self.wait_for_exits(deadline, false).await;
            }
        }
        if !self.wait_for_exits(deadline, true).await {
            for (_, id) in &running {
                if let Err(e) = self.ctx.runtime.kill(id, "KILL").await {
                    log::warn!("pod {name}: {e}");
                }
            }
            self.wait_for_exits(Instant::now() + Duration::from_secs(10), true)
                .await;
        }
        // The final status: the phase is terminal once nothing can run.
        if self
            .containers
            .iter()
            .all(|c| c.record.view.terminated.is_some() || c.record.view.container_id.is_none())
        {
            self.stage.stopped();
        }
        self.write_status();
        for (_, id) in &running {
            self.remove_instance(id).await;
        }
        self.cleanup().await;
        log::info!("pod {name}: terminated and removed");
    }

    /// The deletion abandoned a pass between a container's create and its
    /// start: the instance never ran, and it is deleted at once. Its stop
    /// signal would reach the runtime's init process, which ignores some
    /// (SIGWINCH, httpd's STOPSIGNAL) and would hold the pod for its whole
    /// grace period.
    async fn undo_unstarted(&mut self) {
        use crate::agent::relist::{Verdict, verdict};
        let unstarted: Vec<(usize, String)> = self
            .containers
            .iter()
            .enumerate()
            .filter(|(_, c)| {
                let view = &c.record.view;
                view.terminated.is_none() && view.running_since.is_none()
            })
            .filter_map(|(i, c)| c.record.view.container_id.clone().map(|id| (i, id)))
            .collect();
        if unstarted.is_empty() {
            return;
        }
        // Unknown is not "never started": they are stopped as the others.
        let Ok(listed) = self.ctx.runtime.list().await else {
            return;
        };
        for (i, id) in unstarted {
            if verdict(listed.iter().find(|s| s.id == id)) == Verdict::NeverStarted {
                self.record_unknown_exit(i, &id, "deleted before it started");
                self.remove_instance(&id).await;
            }
        }
    }

    /// Waits for every instance (but sidecars', unless `sidecars_too`) to
    /// have exited; false at the deadline.
    pub(super) async fn wait_for_exits(&mut self, deadline: Instant, sidecars_too: bool) -> bool {
        loop {
            let still_running: Vec<String> = self
                .containers
                .iter()
                .enumerate()
                .filter(|(i, _)| {
                    sidecars_too || self.pod.container(*i).role != ContainerRole::Sidecar
                })
                .map(|(_, c)| c)
                .filter(|c| c.record.view.terminated.is_none())
                .filter_map(|c| c.record.view.container_id.clone())
                .collect();
            if still_running.is_empty() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            // Exits come from the monitor; the runtime is asked too, once a
            // second, in case the monitor is gone.
            let next = deadline.min(Instant::now() + Duration::from_secs(1));
            let exit = async {
                loop {
                    match self.exits_rx.recv().await {
                        Ok(MonitorEvent::Exit(exit)) => return Some(exit),
                        // The runtime is asked below instead.
                        Ok(MonitorEvent::Lost) => continue,
                        Err(_) => return None,
                    }
                }
            };
            let timer = async {
                smol::Timer::at(next).await;
                None
            };
            match exit.or(timer).await {
                Some(exit) => {
                    if let Some(i) = self.containers.iter().position(|c| {
                        c.record.view.container_id.as_deref() == Some(exit.id.as_str())
                    }) {
                        self.record_exit(i, exit, "");
                    }
                }
                None => {
                    // Unknown is not gone: asked again at the next check.
                    let Ok(listed) = self.ctx.runtime.list().await else {
                        continue;
                    };
                    for id in still_running {
                        let alive = listed.iter().any(|s| s.id == id && s.status != "stopped");
                        if !alive
                            && let Some(i) = self.containers.iter().position(|c| {
                                c.record.view.container_id.as_deref() == Some(id.as_str())
                            })
                        {
                            self.record_unknown_exit(i, &id, "seen stopped by the runtime");
                        }
                    }
                }
            }
        }
    }

    /// Removes the pod's sandbox, monitor, cgroups, logs and state.
    pub(super) async fn cleanup(&mut self) {
        let name = self.pod.full_name();
        if let Some(mut monitor) = self.monitor.take()
            && let Err(e) = monitor.shutdown().await
        {
            log::warn!("pod {name}: {e}");
        }
        remove_pod_state(
            &self.ctx,
            &self.dir,
            self.pod.qos,
            &self.pod.uid,
            &self.ctx.config.pod_logs_dir.join(self.pod.log_dir_name()),
        )
        .await;
    }
}

use super::*;

impl Worker {
    /// One level-triggered pass; true if it started a container.
    pub(super) async fn sync(&mut self) -> bool {
        let now = Instant::now();
        for c in &mut self.containers {
            if c.retry_at.is_some_and(|t| t <= now) {
                c.retry_at = None;
            }
        }
        for i in 0..self.containers.len() {
            let c = &mut self.containers[i];
            if c.kill_at.is_some_and(|t| t <= now) {
                c.kill_at = None;
                if let Some(id) = c.record.view.container_id.clone()
                    && c.record.view.terminated.is_none()
                    && let Err(e) = self.ctx.runtime.kill(&id, "KILL").await
                {
                    log::warn!("pod {}: {e}", self.pod.full_name());
                }
            }
        }
        self.enforce_active_deadline().await;
        self.retry_resize(now).await;
        // An evicted pod's stop deadlines still hold; nothing starts.
        if self.evicted.is_some() {
            return false;
        }
        self.stop_sidecars_when_done().await;
        self.stop_ephemeral_when_done().await;
        let n_init = self.pod.init_containers.len();
        // A killed pause took the pod's processes and its PID namespace.
        if self.pod.share_process_namespace
            && self.paths.is_some()
            && !self.sandbox_released
            && !crate::runtime::pause::alive(&self.dir.join("ns"))
        {
            self.paths = None;
        }
        // A pod with init containers that ran before and has a container to
        // restart sets up its sandbox first: if that is a new one, the
        // init containers go first again (see start_over_in_new_sandbox).
        if self.paths.is_none() && n_init > 0 && self.pod.restart_policy != RestartPolicy::Never {
            let restart_pending = (0..self.containers.len()).any(|i| {
                let view = &self.containers[i].record.view;
                view.container_id.is_some()
                    && view
                        .terminated
                        .as_ref()
                        .is_some_and(|t| self.wants_restart(i, t))
            });
            if restart_pending {
                self.ensure_sandbox().await;
            }
        }
        let frontier = self.init_frontier();
        let n_regular_end = n_init + self.pod.containers.len();
        let finished = self.sandbox_released || self.completing || self.phase_is_terminal();
        let mut to_start = Vec::new();
        for i in 0..self.containers.len() {
            if self.containers[i].retry_at.is_some() {
                continue;
            }
            // Init containers one after the other; regular ones after all;
            // ephemeral ones whenever the pod has not finished, as upstream.
            let gated = if i < n_init {
                i > frontier
            } else if i < n_regular_end {
                frontier < n_init
            } else {
                if finished {
                    continue;
                }
                false
            };
            if gated {
                let view = &mut self.containers[i].record.view;
                if view.container_id.is_none() && view.waiting.is_none() {
                    view.waiting = Some(("PodInitializing".into(), String::new()));
                }
                continue;
            }
            let view = &self.containers[i].record.view;
            let running = view.container_id.is_some() && view.terminated.is_none();
            if running {
                continue;
            }
            if let Some(terminated) = view.terminated.clone() {
                let updated = self.containers[i].restart_for_update;
                // An init container that completed in an earlier sandbox.
                let rerun = i < n_init && self.containers[i].record.from_old_sandbox;
                if !self.wants_restart(i, &terminated) && !updated && !rerun {
                    continue;
                }
                let c = &mut self.containers[i];
                let last_end = c.exited_at.unwrap_or(now);
                // A restart for a new spec is not a crash: no backoff.
                let backoff = if updated || rerun {
                    None
                } else {
                    c.restart_backoff.wait_until(last_end, now)
                };
                if let Some(until) = backoff {
                    let delay = c.restart_backoff.delay(now).unwrap_or_default();
                    let name = c.record.view.name.clone();
                    let message = format!(
                        "Back-off restarting failed container {name} in pod {}_{}({})",
                        self.pod.name, self.pod.namespace, self.pod.uid
                    );
                    self.event(Some(&name), EventType::Warning, "BackOff", message);
                    let c = &mut self.containers[i];
                    c.record.view.waiting = Some((
                        "CrashLoopBackOff".into(),
                        format!(
                            "back-off {}s restarting failed container={} pod={}_{}({})",
                            delay.as_secs(),
                            c.record.view.name,
                            self.pod.name,
                            self.pod.namespace,
                            self.pod.uid
                        ),
                    ));
                    c.retry_at = Some(until);
                    continue;
                }
            }
            to_start.push(i);
        }
        let starting = !to_start.is_empty();
        // A pod with nothing (more) to run needs no sandbox or monitor, for
        // instance a completed one adopted after a restart.
        if !to_start.is_empty() && self.ensure_sandbox().await {
            match self.prepare_volumes().await {
                Ok(()) => {
                    for i in to_start {
                        self.start_container(i).await;
                    }
                }
                Err(message) => {
                    log::warn!("pod {}: {message}", self.pod.full_name());
                    self.event(None, EventType::Warning, "FailedMount", message.clone());
                    // A volume type nanolet lacks will not appear: retried
                    // as upstream's volume manager backs off, at its longest.
                    let unsupported = self
                        .pod
                        .volumes
                        .iter()
                        .any(|v| matches!(v.source, VolumeSource::Unsupported { .. }));
                    let retry = if unsupported { 122 } else { 5 };
                    for i in to_start {
                        let c = &mut self.containers[i];
                        if c.record.view.terminated.is_none() {
                            c.record.view.waiting =
                                Some(("ContainerCreating".into(), message.clone()));
                        }
                        c.retry_at = Some(now + Duration::from_secs(retry));
                    }
                }
            }
        } else if self.paths.is_some()
            && !self.sandbox_released
            && self.has_api_volumes()
            && self
                .volumes_written
                .is_none_or(|t| t + VOLUME_REFRESH <= now)
            && let Err(message) = self.prepare_volumes().await
        {
            log::warn!("pod {}: {message}", self.pod.full_name());
        }
        self.save_containers();
        starting
    }

    /// Whether container `i` should get a new instance now that its current
    /// one ended: sidecars always (until the pod completes), init
    /// containers until they succeed unless the policy is Never, regular
    /// containers by the pod's restart policy.
    pub(super) fn wants_restart(&self, i: usize, terminated: &Terminated) -> bool {
        match self.pod.container(i).role {
            ContainerRole::Sidecar => !self.completing,
            ContainerRole::Ephemeral => false,
            ContainerRole::Init => {
                terminated.exit_code != 0 && self.pod.restart_policy != RestartPolicy::Never
            }
            ContainerRole::Regular => match self.pod.restart_policy {
                RestartPolicy::Always => true,
                RestartPolicy::OnFailure => terminated.exit_code != 0,
                RestartPolicy::Never => false,
            },
        }
    }

    /// The first init container that has not done its part yet; the number
    /// of init containers once all have (then regular containers may run).
    pub(super) fn init_frontier(&self) -> usize {
        let n = self.pod.init_containers.len();
        // What ran in an earlier sandbox does not count.
        let views: Vec<ContainerView> = self
            .containers
            .iter()
            .map(|c| {
                let mut view = c.record.view.clone();
                if c.record.from_old_sandbox {
                    view.container_id = None;
                    view.terminated = None;
                }
                view
            })
            .collect();
        if status::previously_initialized(&self.pod, &views) {
            return n;
        }
        (0..n)
            .find(|&i| {
                let c = &self.containers[i];
                if c.record.from_old_sandbox {
                    return true;
                }
                let view = ContainerView {
                    probed_started: c.probes.started(),
                    ..c.record.view.clone()
                };
                !status::init_done(self.pod.container(i).role, &view)
            })
            .unwrap_or(n)
    }

    /// Once every regular container has ended for good (or an init
    /// container failed for good), the sidecars are stopped, as upstream
    /// does for completing pods.
    pub(super) async fn stop_sidecars_when_done(&mut self) {
        let n_init = self.pod.init_containers.len();
        let has_sidecars = self
            .pod
            .init_containers
            .iter()
            .any(|c| c.role == ContainerRole::Sidecar);
        if self.completing || !has_sidecars {
            return;
        }
        let over = |i: usize| {
            self.containers[i]
                .record
                .view
                .terminated
                .as_ref()
                .is_some_and(|t| !self.wants_restart(i, t))
        };
        let init_failed = (0..n_init).any(|i| {
            let failed = self.containers[i]
                .record
                .view
                .terminated
                .as_ref()
                .is_some_and(|t| t.exit_code != 0);
            self.pod.container(i).role == ContainerRole::Init && failed && over(i)
        });
        let regular_done = (n_init..n_init + self.pod.containers.len()).all(over);
        if !(init_failed || regular_done) {
            return;
        }
        self.completing = true;
        let now = Instant::now();
        for i in (0..n_init).rev() {
            if self.pod.container(i).role == ContainerRole::Sidecar {
                self.stop_container(i, now).await;
            }
        }
    }

    /// Sends a running container its stop signal, SIGKILL to follow after
    /// the pod's grace period.
    pub(super) async fn stop_container(&mut self, i: usize, now: Instant) {
        let c = &mut self.containers[i];
        let Some(id) = c.record.view.container_id.clone() else {
            return;
        };
        if c.record.view.terminated.is_some() {
            return;
        }
        c.kill_at = Some(now + self.pod.termination_grace);
        let signal = c.record.stop_signal();
        let name = c.record.view.name.clone();
        self.event(
            Some(&name),
            EventType::Normal,
            "Killing",
            format!("Stopping container {name}"),
        );
        if let Err(e) = self.ctx.runtime.kill(&id, &signal).await {
            log::warn!("pod {}: {e}", self.pod.full_name());
        }
    }

    /// A pod that has ended keeps no debugging container: upstream stops
    /// every container of a terminal pod, and its sandbox goes after them.
    pub(super) async fn stop_ephemeral_when_done(&mut self) {
        if !self.phase_is_terminal() {
            return;
        }
        let now = Instant::now();
        let first = self.pod.init_containers.len() + self.pod.containers.len();
        for i in first..self.containers.len() {
            if self.containers[i].kill_at.is_none() {
                self.stop_container(i, now).await;
            }
        }
    }
}

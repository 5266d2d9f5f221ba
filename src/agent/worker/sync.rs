//! The executor of a pass: it observes what the plan cannot (the pause
//! process, the clock against the pod's deadline), asks `plan` what to do
//! and carries it out.

use super::plan::{self, Action, Facts};
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
        self.retry_resize(now).await;
        // A killed pause took the pod's processes and its PID namespace.
        if self.pod.share_process_namespace
            && self.paths.is_some()
            && !self.stage.is_released()
            && !crate::runtime::pause::alive(&self.dir.join("ns"))
        {
            self.paths = None;
        }
        let mut facts = Facts {
            ended: self.stage.ended().is_some(),
            past_deadline: self.past_active_deadline(),
            completing: self.stage.is_completing(),
            released: self.stage.is_released(),
            phase_terminal: self.phase_is_terminal(),
            sandbox_ready: self.paths.is_some(),
        };
        let mut to_start = Vec::new();
        let mut actions = plan::plan(&self.pod, &self.containers, &facts, now);
        while !actions.is_empty() {
            let mut replan = false;
            for action in actions {
                match action {
                    Action::Kill(i) => self.kill_now(i).await,
                    Action::EndPastDeadline => self.end_past_deadline().await,
                    Action::Complete => self.stage.complete(),
                    Action::Stop(i) => self.stop_container(i, now).await,
                    Action::SetUpSandboxFirst => {
                        self.ensure_sandbox().await;
                        facts.sandbox_ready = true;
                        replan = true;
                    }
                    Action::Gate(i) => {
                        let view = &mut self.containers[i].record.view;
                        if view.container_id.is_none() && view.waiting.is_none() {
                            view.waiting = Some((WaitingReason::PodInitializing, String::new()));
                        }
                    }
                    Action::BackOff {
                        container,
                        until,
                        delay,
                    } => self.back_off(container, until, delay),
                    Action::SetupBackOff { container, until } => {
                        self.back_off_setup(container, until)
                    }
                    Action::Start(i) => to_start.push(i),
                }
            }
            actions = Vec::new();
            if replan {
                facts.completing = self.stage.is_completing();
                actions = plan::plan(&self.pod, &self.containers, &facts, now);
            }
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
                                Some((WaitingReason::ContainerCreating, message.clone()));
                        }
                        c.retry_at = Some(now + Duration::from_secs(retry));
                    }
                }
            }
        } else if self.paths.is_some()
            && !self.stage.is_released()
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

    /// SIGKILL to an instance past its stop deadline.
    async fn kill_now(&mut self, i: usize) {
        let c = &mut self.containers[i];
        c.kill_at = None;
        if let Some(id) = c.record.view.container_id.clone()
            && let Err(e) = self.ctx.runtime.kill(&id, "KILL").await
        {
            log::warn!("pod {}: {e}", self.pod.full_name());
        }
    }

    /// Container `i` crashed and waits for its restart backoff
    /// (CrashLoopBackOff), as upstream reports it.
    fn back_off(&mut self, i: usize, until: Instant, delay: Duration) {
        let name = self.containers[i].record.view.name.clone();
        let pod = format!("{}_{}({})", self.pod.name, self.pod.namespace, self.pod.uid);
        let message = format!("Back-off restarting failed container {name} in pod {pod}");
        self.event(Some(&name), EventType::Warning, "BackOff", message);
        let c = &mut self.containers[i];
        c.record.view.waiting = Some((
            WaitingReason::CrashLoopBackOff,
            format!(
                "back-off {}s restarting failed container={name} pod={pod}",
                delay.as_secs()
            ),
        ));
        c.retry_at = Some(until);
    }

    /// Container `i`'s pull or create failed and waits for its backoff: a
    /// failed pull shows ErrImagePull for a second, then ImagePullBackOff
    /// for the rest of the delay, as upstream.
    fn back_off_setup(&mut self, i: usize, until: Instant) {
        let image = self.pod.container(i).image.clone();
        let c = &mut self.containers[i];
        c.retry_at = Some(until);
        let Some((reason, message)) = &mut c.record.view.waiting else {
            return;
        };
        if *reason != WaitingReason::ErrImagePull {
            return;
        }
        *reason = WaitingReason::ImagePullBackOff;
        *message = format!("Back-off pulling image {image:?}");
        let name = self.pod.container(i).name.clone();
        self.event(
            Some(&name),
            EventType::Normal,
            "BackOff",
            format!("Back-off pulling image {image:?}"),
        );
        self.event(
            Some(&name),
            EventType::Warning,
            "Failed",
            "Error: ImagePullBackOff".into(),
        );
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
}

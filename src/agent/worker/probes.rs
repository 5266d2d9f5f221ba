use super::*;

impl Worker {
    /// Runs the preStop hooks of `containers` together, each bounded by
    /// `deadline`; a failure is an event, and stopping goes on.
    pub(super) async fn pre_stop(&self, containers: &[(usize, String)], deadline: Instant) {
        let mut running = Vec::new();
        for (i, id) in containers {
            let Some(hook) = self.pod.container(*i).hooks.pre_stop.clone() else {
                continue;
            };
            let target = self.probe_target(id.clone(), ProbeKind::Liveness);
            let runtime = self.ctx.runtime.clone();
            let limit = deadline.saturating_duration_since(Instant::now());
            let task =
                crate::rt::spawn(
                    async move { prober::run_hook(&runtime, &hook, &target, limit).await },
                );
            running.push((*i, task));
        }
        for (i, task) in running {
            if let Err(message) = task.await {
                let name = self.pod.container(i).name.clone();
                self.event(
                    Some(&name),
                    EventType::Warning,
                    "FailedPreStopHook",
                    format!("PreStopHook failed: {message}"),
                );
            }
        }
    }

    /// Starts the probes that are due, each as a task of the loop that
    /// reports to `probe_results`.
    pub(super) fn launch_probes(&mut self) {
        let now = Instant::now();
        for i in 0..self.containers.len() {
            let c = &self.containers[i];
            let Some(id) = c.record.view.container_id.clone() else {
                continue;
            };
            if c.record.view.terminated.is_some() {
                continue;
            }
            for kind in c.probes.due(now) {
                let Some(probe) = self.pod.container(i).probes.get(kind).cloned() else {
                    continue;
                };
                self.containers[i].probes.launch(kind);
                let target = self.probe_target(id.clone(), kind);
                let runtime = self.ctx.runtime.clone();
                let results = self.probe_results.0.clone();
                let container_id = id.clone();
                crate::rt::spawn(async move {
                    let outcome = prober::run(&runtime, &probe, &target).await;
                    let _ = results
                        .send(ProbeResult {
                            container: i,
                            kind,
                            container_id,
                            outcome,
                        })
                        .await;
                })
                .detach();
            }
        }
    }

    /// A result counts for the instance it probed, if that still runs.
    pub(super) async fn on_probe_result(&mut self, result: ProbeResult) {
        let Some(c) = self.containers.get(result.container) else {
            return;
        };
        let view = &c.record.view;
        if view.container_id.as_deref() != Some(result.container_id.as_str())
            || view.terminated.is_some()
        {
            return;
        }
        self.on_probe(result.container, result.kind, result.outcome)
            .await;
    }

    pub(super) fn probe_target(&self, container_id: String, kind: ProbeKind) -> prober::Target {
        let pod_ip = if self.pod.host_network {
            Some(
                self.ctx
                    .host_ip
                    .unwrap_or(std::net::Ipv4Addr::LOCALHOST.into()),
            )
        } else {
            self.paths.as_ref().and_then(|p| p.pod_ips.first().copied())
        };
        let scratch = self
            .dir
            .join(format!("probe-{container_id}-{}.pid", kind.name()));
        prober::Target {
            container_id,
            pod_ip,
            netns: (!self.pod.host_network).then(|| self.dir.join("ns").join("net")),
            scratch,
        }
    }

    pub(super) async fn on_probe(&mut self, i: usize, kind: ProbeKind, outcome: Outcome) {
        let name = self.pod.container(i).name.clone();
        crate::stats::own::probe_ran(
            [&self.pod.namespace, &self.pod.name, &self.pod.uid],
            &name,
            kind.name(),
            outcome == Outcome::Success,
        );
        if let Outcome::Failure(message) = &outcome {
            log::debug!(
                "pod {}: {name}: {} probe failed: {message}",
                self.pod.full_name(),
                kind.name()
            );
            let message = format!("{} probe failed: {message}", kind.name());
            self.event(Some(&name), EventType::Warning, "Unhealthy", message);
        }
        let probes = self.pod.container(i).probes.clone();
        let now = Instant::now();
        let verdict =
            self.containers[i]
                .probes
                .record(kind, &probes, outcome == Outcome::Success, now);
        if verdict != Verdict::Kill {
            return;
        }
        let c = &mut self.containers[i];
        let Some(id) = c.record.view.container_id.clone() else {
            return;
        };
        let grace = probes
            .get(kind)
            .and_then(|p| p.termination_grace)
            .unwrap_or(self.pod.termination_grace);
        c.kill_at = Some(now + grace);
        let signal = c.record.stop_signal();
        let message = format!(
            "Container {name} failed {} probe, will be restarted",
            kind.name().to_lowercase()
        );
        log::info!("pod {}: {message}", self.pod.full_name());
        self.event(Some(&name), EventType::Normal, "Killing", message);
        self.pre_stop(&[(i, id.clone())], now + grace).await;
        if let Err(e) = self.ctx.runtime.kill(&id, &signal).await {
            log::warn!("pod {}: {e}", self.pod.full_name());
        }
    }
}

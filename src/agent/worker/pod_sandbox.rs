use super::*;

/// Why a pod's sandbox could not be set up: a volume the way upstream's
/// volume manager reports it, or the sandbox itself.
pub(super) enum SandboxFailure {
    Mount(String),
    Sandbox(String),
}

impl From<String> for SandboxFailure {
    fn from(message: String) -> Self {
        SandboxFailure::Sandbox(message)
    }
}

/// How often volumes fed by the API server are brought up to date (the
/// upstream kubelet resyncs pods every minute).
pub(super) const VOLUME_REFRESH: Duration = Duration::from_secs(60);

impl Worker {
    pub(super) async fn ensure_sandbox(&mut self) -> bool {
        if self.paths.is_some() && self.monitor.is_some() {
            return true;
        }
        let result = async {
            // Before any container: runtimes create only the containers' own.
            let limits = crate::cgroup::pod_limits(&self.pod, self.ctx.config.pod_pids_limit);
            self.ctx
                .cgroups
                .ensure_pod(self.pod.qos, &self.pod.uid, &limits)
                .map_err(|e| e.to_string())?;
            if self.paths.is_none() {
                self.check_runtime_class()
                    .await
                    .map_err(SandboxFailure::Sandbox)?;
                let paths = self.create_sandbox().await.map_err(|e| match e {
                    // Upstream's volume manager reports these, not the
                    // sandbox: FailedMount, and the pod stays
                    // ContainerCreating.
                    sandbox::SandboxError::HostPath {
                        volume,
                        path,
                        reason,
                    } => SandboxFailure::Mount(format!(
                        "MountVolume.SetUp failed for volume {volume:?} : hostPath type check failed: {path} {reason}"
                    )),
                    other => SandboxFailure::Sandbox(other.to_string()),
                })?;
                if paths.recreated {
                    self.start_over_in_new_sandbox();
                    self.save_containers();
                    sandbox::recreation_handled(&self.dir).map_err(|e| e.to_string())?;
                }
                if let Some(pid) = paths
                    .pid_ns
                    .as_ref()
                    .and_then(|_| crate::runtime::pause::pid(&self.dir.join("ns")))
                {
                    self.ctx
                        .cgroups
                        .adopt_pause(self.pod.qos, &self.pod.uid, pid)
                        .map_err(|e| e.to_string())?;
                }
                self.paths = Some(paths);
            }
            if self.monitor.is_none() {
                self.monitor = Some(
                    monitor_client::connect_or_start(
                        &self.dir,
                        &self.ctx.monitor,
                        self.exits_tx.clone(),
                    )
                    .await
                    .map_err(|e| e.to_string())?,
                );
            }
            Ok::<(), SandboxFailure>(())
        }
        .await;
        match result {
            Ok(()) => true,
            Err(failure) => {
                let (reason, message) = match failure {
                    SandboxFailure::Mount(message) => {
                        log::warn!("pod {}: {message}", self.pod.full_name());
                        self.event(None, EventType::Warning, "FailedMount", message.clone());
                        (WaitingReason::ContainerCreating, message)
                    }
                    SandboxFailure::Sandbox(message) => {
                        log::error!("pod {}: sandbox: {message}", self.pod.full_name());
                        self.event(
                            None,
                            EventType::Warning,
                            "FailedCreatePodSandBox",
                            format!("Failed to create pod sandbox: {message}"),
                        );
                        (WaitingReason::CreatePodSandboxError, message)
                    }
                };
                let now = Instant::now();
                self.sandbox_backoff.record_attempt(now);
                let retry = now
                    + self
                        .sandbox_backoff
                        .delay(now)
                        .unwrap_or(Duration::from_secs(10));
                for c in &mut self.containers {
                    if c.record.view.running_since.is_none() {
                        c.record.view.waiting = Some((reason, message.clone()));
                        c.retry_at = Some(retry);
                    }
                }
                false
            }
        }
    }

    /// Makes (or finds again) the pod's sandbox: see `sandbox::create`.
    pub(super) async fn create_sandbox(&self) -> Result<PodPaths, sandbox::SandboxError> {
        sandbox::create(
            &self.pod,
            &self.dir,
            &self.cluster_dns(),
            &self.ctx.cni,
            &self.ctx.monitor.executable,
        )
        .await
    }

    /// A new sandbox for a pod that ran before (after a reboot): its init
    /// containers run again before anything else restarts, as upstream
    /// does when it recreates a sandbox. Pods that never restart stay done.
    pub(super) fn start_over_in_new_sandbox(&mut self) {
        if self.pod.init_containers.is_empty() || self.pod.restart_policy == RestartPolicy::Never {
            return;
        }
        let mut any = false;
        for c in &mut self.containers {
            if c.record.view.container_id.is_some() {
                c.record.from_old_sandbox = true;
                any = true;
            }
        }
        if any {
            log::info!(
                "pod {}: new sandbox; init containers run again",
                self.pod.full_name()
            );
        }
    }

    /// As upstream stops the sandbox of a pod that has finished: its
    /// network gives the address (and any hostPort) back, its namespaces,
    /// pause and volumes go, and so does its monitor. Its status, logs and
    /// dir stay until the pod is deleted.
    pub(super) async fn release_sandbox(&mut self) {
        self.stage.release();
        let name = self.pod.full_name();
        if let Some(mut monitor) = self.monitor.take()
            && let Err(e) = monitor.shutdown().await
        {
            log::warn!("pod {name}: {e}");
        }
        if let Err(e) = sandbox::teardown(&self.dir, &self.ctx.cni).await {
            log::warn!("pod {name}: releasing its sandbox: {e}");
            return;
        }
        // Nothing of it runs: as upstream, a terminated pod's devices are
        // free for others.
        self.ctx.devices.release(&self.pod.uid);
        // Its volumes are torn down as upstream's are for a terminated
        // pod: an evicted pod's emptyDir must give its disk back.
        let volumes = self.dir.join("volumes");
        match crate::helpers::unblock(move || crate::state::remove_tree(&volumes)).await {
            Ok(()) => log::info!("pod {name}: finished; its sandbox and volumes are released"),
            Err(e) => log::warn!("pod {name}: removing its volumes: {e}"),
        }
    }

    pub(super) fn cluster_dns(&self) -> sandbox::ClusterDns {
        let config = &self.ctx.config;
        let wants_cluster = match self.pod.dns_policy {
            crate::pod::DnsPolicy::ClusterFirst => !self.pod.host_network,
            crate::pod::DnsPolicy::ClusterFirstWithHostNet => true,
            crate::pod::DnsPolicy::Default | crate::pod::DnsPolicy::None => false,
        };
        if wants_cluster && config.cluster_dns.is_empty() && config.kubeconfig.is_some() {
            self.event(
                None,
                EventType::Warning,
                "MissingClusterDNS",
                "kubelet does not have ClusterDNS IP configured and cannot create Pod using \"ClusterFirst\" policy. Falling back to \"Default\" policy.".into(),
            );
        }
        sandbox::ClusterDns {
            servers: config.cluster_dns.clone(),
            domain: config.cluster_domain.clone(),
        }
    }

    /// The node's address on the host network, else the pod network's.
    pub(super) fn pod_ips(&self) -> Vec<String> {
        if self.pod.host_network {
            return self.ctx.host_ip.iter().map(|ip| ip.to_string()).collect();
        }
        self.paths
            .iter()
            .flat_map(|p| &p.pod_ips)
            .map(|ip| ip.to_string())
            .collect()
    }

    pub(super) fn has_api_volumes(&self) -> bool {
        self.pod.volumes.iter().any(|v| {
            matches!(&v.source, VolumeSource::Projected(p)
                if p.sources.iter().any(|s| !matches!(s, ProjectionSource::DownwardApi { .. })))
        })
    }

    pub(super) fn downward(&self) -> Downward {
        let (node_cpu_milli, node_memory) = crate::agent::node::allocatable(&self.ctx);
        let host_ip = self.ctx.host_ip.map(|ip| ip.to_string());
        Downward {
            node_name: self.ctx.config.node_name.clone(),
            pod_ips: self.pod_ips(),
            host_ip,
            node_cpu_milli,
            node_memory,
        }
    }

    /// Brings the ConfigMaps, Secrets and tokens the pod reads up to date.
    /// Without the API server the checkpointed copies stay in use.
    pub(super) async fn refresh_objects(&mut self) -> Result<(), String> {
        let refs = references(&self.pod);
        if refs.is_empty() {
            return Ok(());
        }
        let Some(source) = &self.ctx.objects else {
            return Err(
                "ConfigMaps, Secrets and service account tokens need the API server".into(),
            );
        };
        let (uid, namespace) = (self.pod.uid.clone(), self.pod.namespace.clone());
        let mut objects = self.objects.clone();
        let mut failure = None;
        for (kind, names) in [
            (Kind::ConfigMap, &refs.config_maps),
            (Kind::Secret, &refs.secrets),
        ] {
            for name in names {
                match source.get(&uid, kind, &namespace, name).await {
                    Ok(data) => {
                        let map = match kind {
                            Kind::ConfigMap => &mut objects.config_maps,
                            Kind::Secret => &mut objects.secrets,
                        };
                        map.insert(name.clone(), data);
                    }
                    Err(e) => failure = Some(e),
                }
            }
        }
        let now = Timestamp::now();
        for spec in &refs.tokens {
            let key = token_key(spec);
            if objects
                .tokens
                .get(&key)
                .is_none_or(|t| t.needs_refresh(now))
            {
                match source.token(&self.pod, spec).await {
                    Ok(token) => {
                        objects.tokens.insert(key, token);
                    }
                    Err(e) => failure = Some(e),
                }
            }
        }
        if let Some(e) = failure
            && !e.is_unavailable()
        {
            log::warn!("pod {}: {e}", self.pod.full_name());
        }
        if objects != self.objects {
            self.objects = objects;
            self.save_objects().await;
        }
        Ok(())
    }

    /// Checkpoints the pod's objects, off the loop.
    pub(super) async fn save_objects(&self) {
        let (dir, saved) = (self.dir.clone(), self.objects.clone());
        if let Err(e) = crate::helpers::unblock(move || records::write_objects(&dir, &saved)).await
        {
            log::error!("pod {}: {e}", self.pod.full_name());
        }
    }

    /// Checks that the pod's RuntimeClass names the node's runtime, as
    /// upstream resolves it before making a sandbox: through the API
    /// server once, then from the checkpoint. Without an API server
    /// (standalone) the class is not looked up, as upstream's kubelet
    /// without a client has no RuntimeClass manager.
    pub(super) async fn check_runtime_class(&mut self) -> Result<(), String> {
        let (Some(class), Some(source)) = (&self.pod.runtime_class, &self.ctx.objects) else {
            return Ok(());
        };
        let handler = match &self.objects.runtime_handler {
            Some(handler) => handler.clone(),
            None => match source.runtime_handler(class).await {
                Ok(Some(handler)) => {
                    self.objects.runtime_handler = Some(handler.clone());
                    self.save_objects().await;
                    handler
                }
                Ok(None) => {
                    return Err(format!("runtimeclasses.node.k8s.io {class:?} not found"));
                }
                Err(e) => return Err(format!("failed to lookup RuntimeClass {class}: {e}")),
            },
        };
        if handler.is_empty() || handler == self.ctx.runtime.kind.name() {
            Ok(())
        } else {
            Err(format!(
                "failed to get sandbox runtime: no runtime for {handler:?} is configured"
            ))
        }
    }

    /// The Services whose variables a starting container gets. Without the
    /// API server the last ones read stay (they are checkpointed with the
    /// pod's objects); a pod that never read them starts without them,
    /// where upstream's kubelet would wait: a board must start its static
    /// pods offline.
    pub(super) async fn refresh_service_links(&mut self) {
        let Some(source) = &self.ctx.objects else {
            return;
        };
        match source
            .service_links(&self.pod.namespace, self.pod.enable_service_links)
            .await
        {
            Ok(links) if self.objects.services.as_ref() != Some(&links) => {
                self.objects.services = Some(links);
                self.save_objects().await;
            }
            Ok(_) => {}
            Err(e) => {
                if !e.is_unavailable() {
                    log::warn!("pod {}: services: {e}", self.pod.full_name());
                }
            }
        }
    }

    /// Writes the volumes nanolet fills itself, off the loop.
    pub(super) async fn prepare_volumes(&mut self) -> Result<(), String> {
        for volume in &self.pod.volumes {
            if let VolumeSource::Unsupported { kind } = &volume.source {
                return Err(format!(
                    "MountVolume.SetUp failed for volume {:?}: no volume plugin matched: nanolet does not mount {kind} volumes",
                    volume.name
                ));
            }
        }
        self.refresh_objects().await?;
        let downward = self.downward();
        let Some(paths) = &self.paths else {
            return Err("no sandbox".into());
        };
        for volume in &self.pod.volumes {
            let VolumeSource::Projected(projection) = &volume.source else {
                continue;
            };
            let Some((_, dir)) = paths.volumes.iter().find(|(n, _)| *n == volume.name) else {
                continue;
            };
            let files =
                volumes::project(&self.pod, projection, &self.objects, &downward).map_err(|e| {
                    format!("MountVolume.SetUp failed for volume {:?}: {e}", volume.name)
                })?;
            let (dir, group) = (dir.clone(), self.pod.fs_group);
            crate::helpers::unblock(move || volumes::write_atomically(&dir, &files, group))
                .await
                .map_err(|e| {
                    format!("MountVolume.SetUp failed for volume {:?}: {e}", volume.name)
                })?;
        }
        self.volumes_written = Some(Instant::now());
        Ok(())
    }
}

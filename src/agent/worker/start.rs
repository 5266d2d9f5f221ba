use super::*;

/// Makes a container instance's bundle on a helper thread. A deletion may
/// abandon the pass awaiting it; the bundle is then removed once made,
/// since no container record will ever name it.
pub(super) async fn set_up_bundle(
    setup: BundleSetup,
    runtime: crate::runtime::runc::Runtime,
    id: String,
) -> Result<crate::runtime::spec::User, SetupFailure> {
    let (done, outcome) = smol::channel::bounded(1);
    let bundle = setup.bundle.clone();
    crate::rt::spawn(async move {
        let result = crate::helpers::unblock(move || setup.run()).await;
        if done.try_send(result).is_err()
            && let Err(e) = bundle.remove(&runtime, &id).await
        {
            log::warn!("abandoned container {id}: {e}");
        }
    })
    .detach();
    outcome.recv().await.unwrap_or_else(|_| {
        Err((
            WaitingReason::CreateContainerError,
            "the bundle's setup ended without an outcome".to_owned(),
        ))
    })
}

impl Worker {
    /// Pulls the image, creates and starts a new instance of container `i`.
    pub(super) async fn start_container(&mut self, i: usize) {
        let spec_container: Container = self.pod.container(i).clone();
        {
            let c = &mut self.containers[i];
            let initializing = c
                .record
                .view
                .waiting
                .as_ref()
                .is_some_and(|(reason, _)| *reason == WaitingReason::PodInitializing);
            if c.record.view.terminated.is_none()
                && (c.record.view.waiting.is_none() || initializing)
            {
                c.record.view.waiting = Some((WaitingReason::ContainerCreating, String::new()));
            }
        }
        self.write_status();

        let cname = Some(spec_container.name.as_str());
        let present = spec_container.pull_policy != crate::pod::PullPolicy::Always
            && self.ctx.images.is_present(&spec_container.image);
        let image_name = spec_container.image.clone();
        if present {
            let message = format!("Container image {image_name:?} already present on machine");
            self.event(cname, EventType::Normal, "Pulled", message);
        } else if spec_container.pull_policy != crate::pod::PullPolicy::Never {
            self.event(
                cname,
                EventType::Normal,
                "Pulling",
                format!("Pulling image {image_name:?}"),
            );
        }
        let pull_started = Instant::now();
        let auth = self.registry_auth();
        let image = match self
            .ctx
            .images
            .ensure(&spec_container.image, spec_container.pull_policy, &auth)
            .await
        {
            Ok(image) => {
                if !present {
                    let message = format!(
                        "Successfully pulled image {image_name:?} in {:.3}s. Image size: {} bytes.",
                        pull_started.elapsed().as_secs_f64(),
                        image.size
                    );
                    self.event(cname, EventType::Normal, "Pulled", message);
                }
                image
            }
            Err(e) => {
                let reason = match &e {
                    ImageError::InvalidName(_) => WaitingReason::InvalidImageName,
                    ImageError::NeverPull { .. } => WaitingReason::ErrImageNeverPull,
                    _ => WaitingReason::ErrImagePull,
                };
                log::warn!(
                    "pod {}: container {}: {e}",
                    self.pod.full_name(),
                    spec_container.name
                );
                if reason == WaitingReason::ErrImagePull {
                    let message = format!("Failed to pull image {image_name:?}: {e}");
                    self.event(cname, EventType::Warning, "Failed", message);
                }
                self.event(
                    cname,
                    EventType::Warning,
                    "Failed",
                    format!("Error: {reason}"),
                );
                self.setup_failed(i, reason, e.to_string());
                return;
            }
        };

        self.refresh_service_links().await;
        let env = match env::resolve(&self.pod, &spec_container, &self.objects, &self.downward()) {
            Ok(env) => env,
            Err(e) => {
                log::warn!(
                    "pod {}: container {}: {e}",
                    self.pod.full_name(),
                    spec_container.name
                );
                self.event(cname, EventType::Warning, "Failed", format!("Error: {e}"));
                self.setup_failed(i, WaitingReason::CreateContainerConfigError, e.to_string());
                return;
            }
        };
        let spec_container = match spec_container.expand_sub_paths(&env) {
            Ok(container) => container,
            Err(message) => {
                self.create_failed(i, WaitingReason::CreateContainerConfigError, message);
                return;
            }
        };
        let paths = match self.paths_for(&spec_container).await {
            Ok(paths) => paths,
            Err(message) => {
                self.create_failed(i, WaitingReason::CreateContainerError, message);
                return;
            }
        };
        // As upstream, before every start: a plugin's failure fails the
        // container's configuration.
        let devices = self.ctx.devices.clone();
        if let Err(message) = devices.pre_start(&self.pod.uid, &spec_container.name).await {
            self.create_failed(i, WaitingReason::CreateContainerConfigError, message);
            return;
        }
        let device_answer = devices.container_edits(&self.pod.uid, &spec_container.name);
        let id = crate::state::random_hex();
        let bundle = Bundle::new(&self.dir, &id);
        let qos = self.pod.qos;
        // A crash between here and save_containers leaves a bundle no record
        // names; adoption removes such bundles.
        let setup = BundleSetup {
            bundle: bundle.clone(),
            pod: self.pod.clone(),
            container: spec_container.clone(),
            env,
            image: image.config.clone(),
            layers: image.layers.clone(),
            paths,
            cgroups_path: self.ctx.cgroups.container_path(qos, &self.pod.uid, &id),
            cgroup_version: self.ctx.cgroups.version,
            memory_capacity: self.ctx.memory_capacity,
            oom_score_floor: self.ctx.oom_score_floor,
            seccomp_root: self.ctx.layout.seccomp(),
            apparmor_default: crate::runtime::apparmor::host().default_profile(),
            recursive_read_only: self.ctx.recursive_read_only,
            device_answer,
            cdi_dirs: self.ctx.config.cdi_spec_dirs.clone(),
        };
        let user = match set_up_bundle(setup, self.ctx.runtime.clone(), id.clone()).await {
            Ok(user) => user,
            Err((reason, message)) => {
                log::warn!(
                    "pod {}: container {}: {message}",
                    self.pod.full_name(),
                    spec_container.name
                );
                let _ = bundle.remove(&self.ctx.runtime, &id).await;
                self.setup_failed(i, reason, message);
                return;
            }
        };

        let restart_count = {
            let c = &mut self.containers[i];
            c.restart_for_update = false;
            c.record.from_old_sandbox = false;
            c.kill_at = None;
            if let Some(previous) = c.record.view.terminated.take() {
                c.record.view.last_terminated = Some(previous);
                c.record.view.restart_count += 1;
            }
            c.record.view.image_id = image.id.clone();
            // Its groups as containerd reports them: the primary one too.
            let mut groups = vec![user.gid];
            groups.extend(user.additional_gids.iter().filter(|g| **g != user.gid));
            c.record.view.user = Some(status::ProcessUser {
                uid: user.uid,
                gid: user.gid,
                supplemental_groups: groups,
            });
            c.record.view.recursive_read_only = self.ctx.recursive_read_only;
            c.record.view.container_id = Some(id.clone());
            c.record.view.running_since = None;
            c.record.stop_signal = spec_container
                .stop_signal
                .clone()
                .or_else(|| image.config.stop_signal.clone());
            c.record.view.restart_count
        };
        self.save_containers();
        let log_path = self.log_path(&spec_container.name, restart_count);

        let created = async {
            let monitor = self.monitor.as_mut().ok_or("no monitor".to_owned())?;
            monitor
                .create(&id, &bundle.dir, &log_path, spec_container.input)
                .await
                .map_err(|e| e.to_string())
        }
        .await;
        let started = match created {
            Ok(_) => {
                let name = &spec_container.name;
                self.event(
                    cname,
                    EventType::Normal,
                    "Created",
                    format!("Created container: {name}"),
                );
                self.ctx.runtime.start(&id).await.map_err(|e| e.to_string())
            }
            Err(e) => Err(e),
        };
        match &started {
            Ok(()) => {
                let name = &spec_container.name;
                self.event(
                    cname,
                    EventType::Normal,
                    "Started",
                    format!("Started container {name}"),
                );
            }
            Err(message) => {
                self.event(
                    cname,
                    EventType::Warning,
                    "Failed",
                    format!("Error: {message}"),
                );
            }
        }
        let c = &mut self.containers[i];
        c.setup_failed_at = None;
        c.record.view.waiting = None;
        let started_at = Timestamp::now();
        match started {
            Ok(()) => {
                c.record.view.running_since = Some(started_at);
                c.probes = ProbeTracker::start(&spec_container.probes, Instant::now());
                // Upstream's backoff counts restarts: a first start, or the
                // first restart after a quiet period, is immediate.
                if restart_count > 0 {
                    c.restart_backoff.record_attempt(Instant::now());
                }
                log::info!(
                    "pod {}: started container {} ({id}, restart {restart_count})",
                    self.pod.full_name(),
                    spec_container.name
                );
                if let Some(hook) = &spec_container.hooks.post_start {
                    self.post_start(i, &id, hook).await;
                }
            }
            Err(message) => {
                // As upstream: a container that fails to start has ended,
                // with exit code 128, and the restart policy applies.
                log::warn!(
                    "pod {}: container {} failed to start: {message}",
                    self.pod.full_name(),
                    spec_container.name
                );
                c.record.view.terminated = Some(Terminated {
                    exit_code: 128,
                    signal: None,
                    reason: "StartError".into(),
                    started_at: None,
                    finished_at: started_at,
                    container_id: id.clone(),
                    message: Some(message.clone()),
                });
                c.exited_at = Some(Instant::now());
                if restart_count > 0 {
                    c.restart_backoff.record_attempt(Instant::now());
                }
                // No exit will be reported for it: the next pass, at once,
                // applies the restart policy (and its backoff).
                c.retry_at = Some(Instant::now());
                let _ = bundle.remove(&self.ctx.runtime, &id).await;
            }
        }
        self.prune_logs(i);
    }

    /// The sandbox's paths as `container` joins them: an ephemeral
    /// container with a target joins the target's PID namespace, which
    /// must run (upstream's runtimes refuse otherwise).
    pub(super) async fn paths_for(
        &self,
        container: &Container,
    ) -> Result<Option<PodPaths>, String> {
        let Some(target) = &container.target else {
            return Ok(self.paths.clone());
        };
        let not_running = || format!("target container {target:?} is not running");
        let id = self
            .containers
            .iter()
            .find(|c| &c.record.view.name == target)
            .filter(|c| c.record.view.terminated.is_none())
            .and_then(|c| c.record.view.container_id.clone())
            .ok_or_else(not_running)?;
        let state = self
            .ctx
            .runtime
            .state(&id)
            .await
            .map_err(|e| e.to_string())?
            .filter(|s| s.pid > 0 && s.status == "running")
            .ok_or_else(not_running)?;
        Ok(self.paths.clone().map(|mut paths| {
            if !self.pod.host_pid {
                paths.pid_ns = Some(PathBuf::from(format!("/proc/{}/ns/pid", state.pid)));
            }
            paths
        }))
    }

    /// Container `i` could not be created: logged, a Failed event, and
    /// the setup backoff.
    pub(super) fn create_failed(&mut self, i: usize, reason: WaitingReason, message: String) {
        log::warn!("pod {}: {message}", self.pod.full_name());
        let name = self.pod.container(i).name.clone();
        self.event(
            Some(&name),
            EventType::Warning,
            "Failed",
            format!("Error: {message}"),
        );
        self.setup_failed(i, reason, message);
    }

    pub(super) fn setup_failed(&mut self, i: usize, reason: WaitingReason, message: String) {
        let now = Instant::now();
        let c = &mut self.containers[i];
        c.setup_backoff.record_attempt(now);
        c.setup_failed_at = Some(now);
        c.record.view.waiting = Some((reason, message));
        // ErrImagePull shows until the next sync, which then reports
        // ImagePullBackOff for the rest of the delay, as upstream.
        c.retry_at = if reason == WaitingReason::ErrImagePull {
            Some(now + Duration::from_secs(1))
        } else {
            c.setup_backoff.wait_until(now, now)
        };
    }

    pub(super) fn log_path(&self, container: &str, restart_count: u32) -> PathBuf {
        self.ctx
            .config
            .pod_logs_dir
            .join(self.pod.log_dir_name())
            .join(container)
            .join(format!("{restart_count}.log"))
    }

    /// Keeps the current and the previous instance's logs (what `logs
    /// --previous` needs), as upstream's container GC does.
    pub(super) fn prune_logs(&self, i: usize) {
        let view = &self.containers[i].record.view;
        let dir = self
            .ctx
            .config
            .pod_logs_dir
            .join(self.pod.log_dir_name())
            .join(&view.name);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let count: Option<u32> = name.split('.').next().and_then(|n| n.parse().ok());
            if count.is_some_and(|n| n + 1 < view.restart_count) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }

    /// Runs postStart; when it fails the container is stopped, as upstream
    /// does (FailedPostStartHook), and its restart policy applies.
    pub(super) async fn post_start(
        &mut self,
        i: usize,
        id: &str,
        hook: &crate::pod::probe::Handler,
    ) {
        let target = self.probe_target(id.to_owned(), ProbeKind::Liveness);
        let grace = self.pod.termination_grace.max(Duration::from_secs(1));
        let Err(message) = prober::run_hook(&self.ctx.runtime, hook, &target, grace).await else {
            return;
        };
        let name = self.pod.container(i).name.clone();
        log::warn!(
            "pod {}: {name}: postStart hook failed: {message}",
            self.pod.full_name()
        );
        self.event(
            Some(&name),
            EventType::Warning,
            "FailedPostStartHook",
            format!("PostStartHook failed: {message}"),
        );
        let c = &mut self.containers[i];
        c.kill_at = Some(Instant::now() + self.pod.termination_grace);
        let signal = c.record.stop_signal();
        if let Err(e) = self.ctx.runtime.kill(id, &signal).await {
            log::warn!("pod {}: {e}", self.pod.full_name());
        }
    }

    /// Registry credentials from the pod's imagePullSecrets; a missing or
    /// unreadable one is reported and skipped, as upstream does.
    pub(super) fn registry_auth(&self) -> crate::image::auth::RegistryAuth {
        let mut auth = crate::image::auth::RegistryAuth::new();
        for name in &self.pod.image_pull_secrets {
            let data = self.objects.secrets.get(name).and_then(Option::as_ref);
            let config = data.and_then(|d| d.0.get(".dockerconfigjson").or(d.0.get(".dockercfg")));
            let problem = match config {
                Some(bytes) => crate::image::auth::parse_docker_config(bytes, &mut auth).err(),
                None => Some("not found or not a Docker config secret".to_owned()),
            };
            if let Some(problem) = problem {
                let message = format!(
                    "Unable to retrieve some image pull secrets ({name}); attempting to pull the image may not succeed: {problem}"
                );
                self.event(
                    None,
                    EventType::Warning,
                    "FailedToRetrieveImagePullSecret",
                    message,
                );
            }
        }
        // Then the node's own, for registries no secret names (a small
        // file, read at each pull so that changes apply without a restart).
        let node_config = self
            .ctx
            .config
            .docker_config_paths()
            .into_iter()
            .find_map(|path| std::fs::read(&path).ok().map(|bytes| (path, bytes)));
        if let Some((path, bytes)) = node_config
            && let Err(problem) = crate::image::auth::parse_docker_config(&bytes, &mut auth)
        {
            log::warn!("{}: {problem}", path.display());
        }
        auth
    }
}

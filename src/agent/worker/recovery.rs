use super::*;

impl Worker {
    /// Writes the checkpoint: what must bring the pod back after a reboot.
    pub(super) async fn admit(&mut self) -> Result<(), crate::state::StateError> {
        crate::state::create_dir_all(&self.dir, 0o700)?;
        if records::read_checkpoint(&self.dir)?.is_none() {
            let dir = self.dir.clone();
            let checkpoint = Checkpoint {
                uid: self.pod.uid.clone(),
                source: self.pod.source.clone(),
                admitted: self.admitted,
                manifest: self.pod.manifest.clone(),
            };
            // It is fsynced, which can take long on SD cards: off the loop.
            crate::helpers::unblock(move || records::write_checkpoint(&dir, &checkpoint)).await?;
            log::info!(
                "pod {} admitted from {}",
                self.pod.full_name(),
                self.pod.source
            );
        }
        Ok(())
    }

    /// Settles records the relist found the runtime disagreeing with. The
    /// list may be old by now (a container created then has started since):
    /// what it flags is asked again before anything is done. Never during a
    /// pass, so never between a container's create and its start. True if
    /// the list flagged anything.
    pub(super) async fn heal(&mut self, listed: &[crate::runtime::runc::State]) -> bool {
        use crate::agent::relist::{Verdict, verdict};
        let unfinished = |c: &ContainerState| {
            c.record
                .view
                .container_id
                .clone()
                .filter(|_| c.record.view.terminated.is_none())
        };
        let flagged: Vec<usize> = (0..self.containers.len())
            .filter(|&i| {
                unfinished(&self.containers[i])
                    .is_some_and(|id| verdict(listed.iter().find(|s| s.id == id)) != Verdict::Fine)
            })
            .collect();
        let named = |containers: &[ContainerState], id: &str| {
            containers
                .iter()
                .any(|c| unfinished(c).is_some_and(|own| own == id))
        };
        let stray = listed.iter().any(|s| !named(&self.containers, &s.id));
        if flagged.is_empty() && !stray {
            return false;
        }
        let Ok(fresh) = self.ctx.runtime.list().await else {
            return true;
        };
        // Instances of this pod no record runs (an exit handled, a
        // removal that failed): gone with their bundles.
        let bundles = self.dir.join("containers");
        for state in &fresh {
            if listed.iter().any(|s| s.id == state.id)
                && !named(&self.containers, &state.id)
                && Path::new(&state.bundle) == bundles.join(&state.id)
            {
                log::warn!(
                    "pod {}: removing container {}, which no record runs",
                    self.pod.full_name(),
                    state.id
                );
                self.remove_instance(&state.id).await;
            }
        }
        let exits = crate::monitor::recorded_exits(&self.dir);
        let name = self.pod.full_name();
        let mut healed = false;
        for i in flagged {
            let Some(id) = unfinished(&self.containers[i]) else {
                continue;
            };
            let container = self.containers[i].record.view.name.clone();
            match verdict(fresh.iter().find(|s| s.id == id)) {
                Verdict::Fine => continue,
                Verdict::Gone => {
                    log::warn!("pod {name}: container {container} is gone with no exit reported");
                    match exits.iter().find(|e| e.id == id) {
                        Some(exit) => self.record_exit(i, exit.clone(), "found by the relist"),
                        None => self.record_unknown_exit(i, &id, "found by the relist"),
                    }
                }
                Verdict::NeverStarted => {
                    log::warn!("pod {name}: container {container} was created and never started");
                    self.record_unknown_exit(i, &id, "never started");
                }
            }
            healed = true;
            self.remove_instance(&id).await;
        }
        if healed {
            self.save_containers();
            self.write_status();
        }
        true
    }

    /// The runtime's containers, `None` when it could not list them in a
    /// few tries: unknown, which is not "none".
    pub(super) async fn list_runtime(&self) -> Option<Vec<crate::runtime::runc::State>> {
        let mut delay = Duration::from_millis(500);
        for attempt in 1..=3 {
            match self.ctx.runtime.list().await {
                Ok(listed) => return Some(listed),
                Err(e) if attempt == 3 => {
                    log::warn!(
                        "pod {}: listing containers: {e}; keeping what the records say",
                        self.pod.full_name()
                    );
                }
                Err(_) => {
                    smol::Timer::after(delay).await;
                    delay *= 2;
                }
            }
        }
        None
    }

    /// After an agent restart: reattach to the monitor and settle what
    /// happened to each container while nobody listened.
    pub(super) async fn adopt(&mut self) {
        self.remove_orphan_bundles().await;
        let has_instances = self
            .containers
            .iter()
            .any(|c| c.record.view.container_id.is_some());
        self.start_observed = has_instances;
        if !has_instances {
            return;
        }
        if let Ok(connection) = monitor_client::connect(&self.dir, self.exits_tx.clone()).await {
            self.monitor = Some(connection);
        }
        let exits = crate::monitor::recorded_exits(&self.dir);
        let listed = self.list_runtime().await;
        let mut adopted_running = false;
        for i in 0..self.containers.len() {
            let view = &self.containers[i].record.view;
            let Some(id) = view.container_id.clone() else {
                continue;
            };
            if view.terminated.is_some() {
                continue;
            }
            if let Some(exit) = exits.iter().find(|e| e.id == id) {
                self.record_exit(i, exit.clone(), "exited while the agent was down");
                continue;
            }
            // A runtime that cannot list says nothing: what the records
            // say stands (the monitor reports the exits it sees).
            let Some(listed) = &listed else {
                adopted_running |= view.running_since.is_some();
                continue;
            };
            match listed
                .iter()
                .find(|s| s.id == id)
                .map(|s| s.status.as_str())
            {
                Some("running") => {
                    log::info!(
                        "pod {}: adopted running container {}",
                        self.pod.full_name(),
                        view.name
                    );
                    // Probes start over, as after an upstream kubelet
                    // restart; their initial delays are long past.
                    self.containers[i].probes =
                        ProbeTracker::start(&self.pod.container(i).probes, Instant::now());
                    // Killed between `runc start` and recording it: the
                    // container runs, its record still says it is being
                    // created.
                    let view = &mut self.containers[i].record.view;
                    if view.running_since.is_none() {
                        view.running_since = Some(Timestamp::now());
                        view.waiting = None;
                    }
                    adopted_running = true;
                }
                other => {
                    // Created but never started, or gone without a recorded
                    // exit (its monitor died): upstream calls this unknown.
                    log::warn!(
                        "pod {}: container {} is {:?} with no recorded exit",
                        self.pod.full_name(),
                        view.name,
                        other.unwrap_or("gone")
                    );
                    self.record_unknown_exit(i, &id, "");
                    // One left created would hold its ID and rootfs for good.
                    self.remove_instance(&id).await;
                }
            }
        }
        self.save_containers();
        // The sandbox is there; reading it back gives the pod its IPs (and
        // CHECKs its network) for status and probes.
        if adopted_running {
            match self.create_sandbox().await {
                Ok(paths) => self.paths = Some(paths),
                Err(e) => log::warn!("pod {}: sandbox: {e}", self.pod.full_name()),
            }
        }
    }

    /// Bundles no container record names: left by a crash while an
    /// instance was being prepared.
    pub(super) async fn remove_orphan_bundles(&self) {
        let Ok(entries) = std::fs::read_dir(self.dir.join("containers")) else {
            return;
        };
        for entry in entries.flatten() {
            let id = entry.file_name().to_string_lossy().into_owned();
            let named = self.containers.iter().any(|c| {
                c.record.view.container_id.as_deref() == Some(id.as_str())
                    && c.record.view.terminated.is_none()
            });
            if !named {
                log::info!(
                    "pod {}: removing leftover container {id}",
                    self.pod.full_name()
                );
                self.remove_instance(&id).await;
            }
        }
    }

    pub(super) fn record_exit(&mut self, i: usize, exit: Exit, note: &str) {
        let c = &mut self.containers[i];
        let reason = if exit.exit_code == 0 {
            "Completed"
        } else {
            "Error"
        };
        c.record.view.terminated = Some(Terminated {
            exit_code: exit.exit_code,
            signal: exit.signal,
            reason: reason.into(),
            started_at: c.record.view.running_since,
            finished_at: exit.finished_at,
            container_id: exit.id.clone(),
            message: None,
        });
        c.record.view.running_since = None;
        c.exited_at = Some(Instant::now());
        c.probes.stop();
        // Read while the bundle (and the file) is still there.
        let id = exit.id.clone();
        let message = self.termination_message(i, &id);
        let c = &mut self.containers[i];
        if let Some(t) = &mut c.record.view.terminated {
            t.message = message;
        }
        log::info!(
            "pod {}: container {} exited with code {}{}",
            self.pod.full_name(),
            c.record.view.name,
            exit.exit_code,
            if note.is_empty() {
                String::new()
            } else {
                format!(" ({note})")
            }
        );
    }

    /// An instance ended without a recorded exit: upstream reports such a
    /// container as ContainerStatusUnknown with exit code 137.
    pub(super) fn record_unknown_exit(&mut self, i: usize, id: &str, note: &str) {
        let exit = Exit {
            id: id.to_owned(),
            pid: 0,
            exit_code: 137,
            signal: None,
            finished_at: Timestamp::now(),
        };
        self.record_exit(i, exit, note);
        if let Some(t) = &mut self.containers[i].record.view.terminated {
            t.reason = "ContainerStatusUnknown".into();
        }
    }

    pub(super) async fn on_exit(&mut self, exit: Exit) {
        let Some(i) = self.containers.iter().position(|c| {
            c.record.view.container_id.as_deref() == Some(exit.id.as_str())
                && c.record.view.terminated.is_none()
        }) else {
            return;
        };
        let id = exit.id.clone();
        let cgroup = self
            .ctx
            .cgroups
            .container_path(self.pod.qos, &self.pod.uid, &id);
        let oom = exit.exit_code == 137 && crate::cgroup::oom_killed(&cgroup);
        self.record_exit(i, exit, if oom { "OOM-killed" } else { "" });
        if oom && let Some(t) = &mut self.containers[i].record.view.terminated {
            t.reason = "OOMKilled".into();
        }
        self.save_containers();
        self.write_status();
        // The instance is over; its logs stay, its runtime state and rootfs go.
        self.remove_instance(&id).await;
        let _ = std::fs::remove_file(
            self.dir
                .join(crate::runtime::protocol::EXITS_DIR)
                .join(format!("{id}.json")),
        );
    }

    /// The monitor died: nobody holds the containers' stdio or will see their
    /// exits. Rather than run containers without logs or exit codes, they
    /// are stopped and the restart policy decides, with a new monitor.
    pub(super) async fn on_monitor_lost(&mut self) {
        if self.monitor.take().is_none() {
            return;
        }
        log::warn!(
            "pod {}: its monitor is gone; stopping its containers",
            self.pod.full_name()
        );
        for i in 0..self.containers.len() {
            let view = &self.containers[i].record.view;
            let Some(id) = view
                .container_id
                .clone()
                .filter(|_| view.terminated.is_none())
            else {
                continue;
            };
            if let Err(e) = self.ctx.runtime.kill(&id, "KILL").await {
                log::warn!("pod {}: {e}", self.pod.full_name());
            }
            self.record_unknown_exit(i, &id, "monitor lost");
            self.remove_instance(&id).await;
        }
        self.save_containers();
    }

    /// Why container `i`'s instance `id` ended, as it wrote it to its
    /// terminationMessagePath (at most 4 KiB), or with
    /// FallbackToLogsOnError and a failure, its log's last 80 lines (at most
    /// 2 KiB), as upstream.
    pub(super) fn termination_message(&self, i: usize, id: &str) -> Option<String> {
        let spec = self.pod.container(i);
        let file = Bundle::new(&self.dir, id).termination_log();
        let mut written = Vec::new();
        if let Ok(f) = std::fs::File::open(&file) {
            use std::io::Read;
            let _ = f.take(4096).read_to_end(&mut written);
        }
        if !written.is_empty() {
            return Some(String::from_utf8_lossy(&written).into_owned());
        }
        let view = &self.containers[i].record.view;
        let failed = view.terminated.as_ref().is_some_and(|t| t.exit_code != 0);
        if !(spec.termination_message_from_logs && failed) {
            return None;
        }
        let log = self.log_path(&spec.name, view.restart_count);
        let tail = crate::monitor::log::tail_messages(&log, 80, 2048);
        (!tail.is_empty()).then_some(tail)
    }

    /// Deletes an instance from the runtime and removes its bundle (rootfs
    /// mount and all); a failure is logged, and the relist tries again.
    pub(super) async fn remove_instance(&self, id: &str) {
        if let Err(e) = Bundle::new(&self.dir, id)
            .remove(&self.ctx.runtime, id)
            .await
        {
            log::warn!("pod {}: removing container {id}: {e}", self.pod.full_name());
        }
    }
}

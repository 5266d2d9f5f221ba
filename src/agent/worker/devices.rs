use super::*;

impl Worker {
    /// Gives the pod the device plugins' devices its containers ask for,
    /// before anything of it runs. As upstream's admission: a pod that
    /// cannot have them fails, with reason UnexpectedAdmissionError.
    pub(super) async fn allocate_devices(&mut self) {
        let devices = self.ctx.devices.clone();
        if !self.stage.may_end() || self.ran_to_its_end() || !devices.wanted_by(&self.pod) {
            return;
        }
        let running: std::collections::BTreeSet<String> = self
            .containers
            .iter()
            .map(|c| &c.record.view)
            .filter(|v| v.running_since.is_some() && v.terminated.is_none())
            .map(|v| v.name.clone())
            .collect();
        let allocated = devices
            .allocate(&self.pod, &|name| running.contains(name))
            .await;
        if let Err(e) = allocated {
            let message =
                format!("Pod was rejected: Allocate failed due to {e}, which is unexpected");
            let reason = "UnexpectedAdmissionError";
            self.event(None, EventType::Warning, reason, message.clone());
            let ended = Ended {
                reason: reason.into(),
                message,
            };
            self.end(ended, Duration::ZERO).await;
        }
    }
}

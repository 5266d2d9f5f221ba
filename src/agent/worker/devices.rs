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
        if let Err(e) = devices.allocate(&self.pod).await {
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

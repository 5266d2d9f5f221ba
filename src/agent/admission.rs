//! Admission of API pods, as upstream's resource predicate does it: a new
//! pod runs only if its requests fit in what the admitted pods leave of the
//! node's allocatable CPU and memory, and the pod count stays within
//! maxPods. Pods are admitted in creation order; a refused pod gets phase
//! Failed with reason OutOfcpu, OutOfmemory or OutOfpods.

use crate::pod::Pod;

/// A pod's CPU (millicores) and memory requests, init containers counted
/// as upstream does.
pub fn requests(pod: &Pod) -> (u64, u64) {
    (
        pod.pod_total(|c| c.resources.cpu_request_milli.unwrap_or(0)),
        pod.pod_total(|c| c.resources.memory_request.unwrap_or(0)),
    )
}

#[derive(Debug, Clone, Copy)]
pub struct Capacity {
    pub cpu_milli: u64,
    pub memory: u64,
    pub pods: u64,
}

/// What admitted pods use.
#[derive(Debug, Clone, Copy, Default)]
pub struct Used {
    pub cpu_milli: u64,
    pub memory: u64,
    pub pods: u64,
}

/// `Err((reason, message))` when `pod` does not fit; otherwise it is added
/// to `used`.
pub fn admit(pod: &Pod, capacity: &Capacity, used: &mut Used) -> Result<(), (String, String)> {
    let (cpu, memory) = requests(pod);
    let refuse = |resource: &str, requested: u64, used: u64, capacity: u64| {
        let reason = format!("OutOf{resource}");
        let message = format!(
            "Node didn't have enough resource: {resource}, requested: {requested}, used: {used}, capacity: {capacity}"
        );
        Err((reason, message))
    };
    if used.pods + 1 > capacity.pods {
        return refuse("pods", 1, used.pods, capacity.pods);
    }
    if cpu > 0 && used.cpu_milli + cpu > capacity.cpu_milli {
        return refuse("cpu", cpu, used.cpu_milli, capacity.cpu_milli);
    }
    if memory > 0 && used.memory + memory > capacity.memory {
        return refuse("memory", memory, used.memory, capacity.memory);
    }
    used.pods += 1;
    used.cpu_milli += cpu;
    used.memory += memory;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(cpu: &str, memory: &str) -> Pod {
        crate::pod::manifest::parse_one(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: p}}\nspec:\n  containers:\n  - name: c\n    image: i:1\n    resources: {{requests: {{cpu: {cpu}, memory: {memory}}}}}\n"
        ))
    }

    #[test]
    fn fits_or_names_the_resource() {
        let capacity = Capacity {
            cpu_milli: 1000,
            memory: 1 << 30,
            pods: 2,
        };
        let mut used = Used::default();
        assert!(admit(&pod("600m", "100Mi"), &capacity, &mut used).is_ok());
        let (reason, message) = admit(&pod("500m", "100Mi"), &capacity, &mut used).unwrap_err();
        assert_eq!(reason, "OutOfcpu");
        assert_eq!(
            message,
            "Node didn't have enough resource: cpu, requested: 500, used: 600, capacity: 1000"
        );
        assert_eq!(
            admit(&pod("100m", "2Gi"), &capacity, &mut used)
                .unwrap_err()
                .0,
            "OutOfmemory"
        );
        assert!(admit(&pod("100m", "1Mi"), &capacity, &mut used).is_ok());
        assert_eq!(
            admit(&pod("1m", "1Mi"), &capacity, &mut used)
                .unwrap_err()
                .0,
            "OutOfpods"
        );
    }
}

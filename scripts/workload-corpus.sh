#!/bin/sh
# Fetches the workload corpus: manifests of widely used cluster add-ons
# (Calico's node DaemonSet, kube-proxy, fluentd, node-problem-detector,
# NodeLocal DNS, ip-masq-agent, the NVIDIA device plugin, CoreDNS,
# metrics-server, the dashboard, the DNS autoscaler) as Kubernetes 1.20
# shipped them in cluster/addons, from Debian's source package of
# Kubernetes. Nothing of them is kept in this repository; they are cached
# in DEST (default target/workload-corpus) and fetched once.
#
# Usage: scripts/workload-corpus.sh [DEST]
set -eu
dest=${1:-target/workload-corpus}
files="
calico-policy-controller/calico-serviceaccount.yaml
calico-policy-controller/calico-node-daemonset.yaml
kube-proxy/kube-proxy-rbac.yaml
kube-proxy/kube-proxy-ds.yaml
fluentd-elasticsearch/fluentd-es-configmap.yaml
fluentd-elasticsearch/fluentd-es-ds.yaml
fluentd-gcp/fluentd-gcp-ds-sa.yaml
fluentd-gcp/fluentd-gcp-configmap.yaml
fluentd-gcp/fluentd-gcp-ds.yaml
node-problem-detector/npd.yaml
dns/nodelocaldns/nodelocaldns.yaml
ip-masq-agent/ip-masq-agent.yaml
device-plugins/nvidia-gpu/daemonset.yaml
dns/coredns/coredns.yaml.base
metrics-server/metrics-server-deployment.yaml
dashboard/dashboard.yaml
dns-horizontal-autoscaler/dns-horizontal-autoscaler.yaml
"
if [ -f "$dest/complete" ]; then
    exit 0
fi
mkdir -p "$dest/apt/lists/partial" "$dest/apt/cache/archives/partial"
echo "deb-src http://deb.debian.org/debian bookworm main" > "$dest/apt/sources.list"
apt_opts="-o Dir::Etc::SourceList=$dest/apt/sources.list -o Dir::Etc::SourceParts=/dev/null
 -o Dir::State::Lists=$dest/apt/lists -o Dir::Cache=$dest/apt/cache
 -o APT::Sandbox::User=root"
# shellcheck disable=SC2086
apt-get -q $apt_opts update >/dev/null
cd "$dest"
# shellcheck disable=SC2086
apt-get -q $apt_opts source --download-only kubernetes >/dev/null
tarball=$(ls kubernetes_*.orig.tar.gz | head -n 1)
top=$(tar tzf "$tarball" | head -n 1 | cut -d/ -f1)
members=""
for f in $files; do
    members="$members $top/cluster/addons/$f"
done
# shellcheck disable=SC2086
tar xzf "$tarball" $members
rm -rf addons
mv "$top/cluster/addons" addons
rm -rf "$top" "$tarball" kubernetes_*.debian.tar.* kubernetes_*.dsc apt
touch complete

package kubernetes_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// endpoint is a pod in a namespace, or (apiServer) the Kubernetes API, which no pod selector
// matches.
type endpoint struct {
	name, namespace string
	labels          map[string]string
	ports           []corev1.ContainerPort
	apiServer       bool
}

const shopNamespace = "outboxshop"

// netPolicies evaluates NetworkPolicies (networking/v1) as a CNI enforces them: a pod that
// a policy of a type selects is isolated for that direction, and then only the union of the
// rules of the policies that select it allows a connection.
type netPolicies struct {
	t        *testing.T
	policies []*networkingv1.NetworkPolicy
	// namespaces' labels: kubernetes.io/metadata.name, as Kubernetes sets.
}

func hasType(p *networkingv1.NetworkPolicy, typ networkingv1.PolicyType) bool {
	if len(p.Spec.PolicyTypes) == 0 { // the default: Ingress, and Egress when it has rules
		return typ == networkingv1.PolicyTypeIngress || len(p.Spec.Egress) > 0
	}
	return slices.Contains(p.Spec.PolicyTypes, typ)
}

func (n netPolicies) matches(ls metav1.LabelSelector, set map[string]string) bool {
	sel, err := metav1.LabelSelectorAsSelector(&ls)
	require.NoError(n.t, err)
	return sel.Matches(labels.Set(set))
}

// peerMatches: does the peer of a rule of a policy in the shop's namespace match e?
func (n netPolicies) peerMatches(peer networkingv1.NetworkPolicyPeer, e endpoint) bool {
	if peer.IPBlock != nil {
		n.t.Fatalf("ipBlock peers are not modelled")
	}
	if e.apiServer {
		return false
	}
	if peer.NamespaceSelector == nil && e.namespace != shopNamespace {
		return false
	}
	if peer.NamespaceSelector != nil && !n.matches(*peer.NamespaceSelector, map[string]string{"kubernetes.io/metadata.name": e.namespace}) {
		return false
	}
	return peer.PodSelector == nil || n.matches(*peer.PodSelector, e.labels)
}

// portMatches: does a rule's port match port (of protocol proto) on the destination dst?
func portMatches(ports []networkingv1.NetworkPolicyPort, dst endpoint, port int32, proto corev1.Protocol) bool {
	if len(ports) == 0 {
		return true
	}
	for _, p := range ports {
		pp := corev1.ProtocolTCP
		if p.Protocol != nil {
			pp = *p.Protocol
		}
		if pp != proto {
			continue
		}
		if p.Port == nil {
			return true
		}
		num := p.Port.IntVal
		if p.Port.StrVal != "" { // a named port: the destination pod's
			num = -1
			for _, cp := range dst.ports {
				if cp.Name == p.Port.StrVal {
					num = cp.ContainerPort
				}
			}
		}
		end := num
		if p.EndPort != nil {
			end = *p.EndPort
		}
		if num >= 0 && port >= num && port <= end {
			return true
		}
	}
	return false
}

// allowed reports whether src may open a connection to port of dst.
func (n netPolicies) allowed(src, dst endpoint, port int32, proto corev1.Protocol) bool {
	egressOK := func() bool {
		if src.namespace != shopNamespace { // not ours to restrict
			return true
		}
		isolated := false
		for _, p := range n.policies {
			if !hasType(p, networkingv1.PolicyTypeEgress) || !n.matches(p.Spec.PodSelector, src.labels) {
				continue
			}
			isolated = true
			for _, r := range p.Spec.Egress {
				peerOK := len(r.To) == 0
				for _, peer := range r.To {
					peerOK = peerOK || n.peerMatches(peer, dst)
				}
				if peerOK && portMatches(r.Ports, dst, port, proto) {
					return true
				}
			}
		}
		return !isolated
	}
	ingressOK := func() bool {
		if dst.namespace != shopNamespace || dst.apiServer {
			return true
		}
		isolated := false
		for _, p := range n.policies {
			if !hasType(p, networkingv1.PolicyTypeIngress) || !n.matches(p.Spec.PodSelector, dst.labels) {
				continue
			}
			isolated = true
			for _, r := range p.Spec.Ingress {
				peerOK := len(r.From) == 0
				for _, peer := range r.From {
					peerOK = peerOK || n.peerMatches(peer, src)
				}
				if peerOK && portMatches(r.Ports, dst, port, proto) {
					return true
				}
			}
		}
		return !isolated
	}
	return egressOK() && ingressOK()
}

// TestNetworkPolicies evaluates the NetworkPolicies of the build for every pair of pods
// (the shop's, the operators' instances, and the outsiders that talk to them: Prometheus,
// the operators, an ingress controller, kube-dns, the Kubernetes API) on every port the
// destination has, and requires exactly the connections network/policies.yaml lists.
func TestNetworkPolicies(t *testing.T) {
	t.Parallel()
	c := theCluster(t)
	var eps []endpoint
	for _, d := range all[appsv1.Deployment](t) {
		eps = append(eps, endpoint{name: d.Name, namespace: shopNamespace, labels: d.Spec.Template.Labels, ports: d.Spec.Template.Spec.Containers[0].Ports})
	}
	for _, j := range all[batchv1.Job](t) {
		eps = append(eps, endpoint{name: j.Name, namespace: shopNamespace, labels: j.Spec.Template.Labels, ports: j.Spec.Template.Spec.Containers[0].Ports})
	}
	for _, p := range c.pods {
		switch p.owner {
		case "RabbitmqCluster shop-mq":
			eps = append(eps, endpoint{name: "shop-mq", namespace: shopNamespace, labels: p.labels, ports: p.ports})
		case "Cluster shop-db":
			eps = append(eps, endpoint{name: "shop-db", namespace: shopNamespace, labels: p.labels, ports: p.ports})
		}
	}
	require.Len(t, eps, 8, "the shop's pods: 4 Deployments, 2 Jobs, the broker's and the database's")
	tcp := func(ports ...int32) []corev1.ContainerPort {
		var out []corev1.ContainerPort
		for _, p := range ports {
			out = append(out, corev1.ContainerPort{ContainerPort: p})
		}
		return out
	}
	eps = append(eps,
		endpoint{name: "prometheus", namespace: "monitoring", labels: map[string]string{"app.kubernetes.io/name": "prometheus"}, ports: tcp(9090)},
		endpoint{name: "cnpg-operator", namespace: "cnpg-system", labels: map[string]string{"app.kubernetes.io/name": "cloudnative-pg"}, ports: tcp(9443)},
		endpoint{name: "rabbitmq-operator", namespace: "rabbitmq-system", labels: map[string]string{"app.kubernetes.io/name": "rabbitmq-cluster-operator"}, ports: tcp(9782)},
		endpoint{name: "ingress", namespace: "ingress-nginx", labels: map[string]string{"app.kubernetes.io/name": "ingress-nginx"}, ports: tcp(80, 443)},
		endpoint{name: "kube-dns", namespace: "kube-system", labels: map[string]string{"k8s-app": "kube-dns"},
			ports: []corev1.ContainerPort{{ContainerPort: 53, Protocol: corev1.ProtocolUDP}, {ContainerPort: 53, Protocol: corev1.ProtocolTCP}}},
		endpoint{name: "kube-apiserver", apiServer: true, ports: tcp(443, 6443)},
	)

	n := netPolicies{t: t, policies: all[networkingv1.NetworkPolicy](t)}
	var got []string
	for _, src := range eps {
		if src.apiServer {
			continue
		}
		for _, dst := range eps {
			for _, p := range dst.ports {
				proto := p.Protocol
				if proto == "" {
					proto = corev1.ProtocolTCP
				}
				if n.allowed(src, dst, p.ContainerPort, proto) && (src.namespace == shopNamespace || dst.namespace == shopNamespace) {
					got = append(got, fmt.Sprintf("%s -> %s:%d/%s", src.name, dst.name, p.ContainerPort, proto))
				}
			}
		}
	}

	var want []string
	add := func(from []string, to string, ports ...string) {
		for _, f := range from {
			for _, p := range ports {
				want = append(want, fmt.Sprintf("%s -> %s:%s", f, to, p))
			}
		}
	}
	shop := []string{"orders-api", "orders-relay", "warehouse", "warehouse-relay"}
	migrations := []string{"orders-migrate", "warehouse-migrate"}
	inNamespace := slices.Concat(shop, migrations, []string{"shop-db", "shop-mq"})
	add(inNamespace, "kube-dns", "53/UDP", "53/TCP")
	add(slices.Concat(shop, migrations, []string{"shop-db"}), "shop-db", "5432/TCP")
	add(shop, "shop-mq", "5671/TCP")
	add([]string{"cnpg-operator"}, "shop-db", "8000/TCP")
	add([]string{"shop-mq"}, "shop-mq", "4369/TCP", "25672/TCP", "35672/TCP")
	add([]string{"rabbitmq-operator"}, "shop-mq", "15671/TCP")
	add([]string{"prometheus"}, "shop-mq", "15691/TCP")
	add([]string{"shop-db", "shop-mq"}, "kube-apiserver", "443/TCP", "6443/TCP")
	// The Kubernetes API has no pod to select: its ports are open to any address, the
	// ingress controller's 443 included (no pod of the namespace listens on them).
	add([]string{"shop-db", "shop-mq"}, "ingress", "443/TCP")
	// The APIs from other namespaces; the ops ports from Prometheus only.
	outside := []string{"prometheus", "cnpg-operator", "rabbitmq-operator", "ingress", "kube-dns"}
	add(outside, "orders-api", "8080/TCP")
	add(outside, "warehouse", "8090/TCP")
	add([]string{"prometheus"}, "orders-api", "9090/TCP")
	add([]string{"prometheus"}, "warehouse", "9090/TCP")
	add([]string{"prometheus"}, "orders-relay", "8081/TCP")
	add([]string{"prometheus"}, "warehouse-relay", "8091/TCP")
	require.ElementsMatch(t, want, got, "the connections the NetworkPolicies allow")

	// What must never be, spelled out.
	byName := map[string]endpoint{}
	for _, e := range eps {
		byName[e.name] = e
	}
	for _, tc := range []struct {
		src, dst string
		port     int32
	}{
		{"warehouse", "orders-api", 8080}, {"warehouse-relay", "orders-api", 8080},
		{"orders-api", "warehouse", 8090}, {"orders-relay", "warehouse", 8090},
		{"ingress", "orders-relay", 8081}, {"ingress", "orders-api", 9090},
		{"orders-migrate", "shop-mq", 5671}, {"ingress", "shop-db", 5432}, {"ingress", "shop-mq", 5671},
		{"prometheus", "shop-db", 5432}, {"shop-db", "orders-api", 8080},
	} {
		require.False(t, n.allowed(byName[tc.src], byName[tc.dst], tc.port, corev1.ProtocolTCP), "%s -> %s:%d", tc.src, tc.dst, tc.port)
	}
}

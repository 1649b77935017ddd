package kubernetes_test

import (
	"path"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
)

// TestWarehouseAdminToken: the warehouse API reads its admin token from a file of the
// Secret warehouse-admin (WAREHOUSE_ADMIN_TOKEN_FILE into a read-only Secret volume, readable
// by the pod's fsGroup), never from a value in the manifests; no other Deployment is given it.
func TestWarehouseAdminToken(t *testing.T) {
	t.Parallel()
	found := false
	for _, d := range all[appsv1.Deployment](t) {
		spec := d.Spec.Template.Spec
		for _, ctr := range spec.Containers {
			for _, e := range ctr.Env {
				require.NotEqual(t, "WAREHOUSE_ADMIN_TOKEN", e.Name, "Deployment %s: the token as a value", d.Name)
				if e.Name != "WAREHOUSE_ADMIN_TOKEN_FILE" {
					continue
				}
				require.Equal(t, "warehouse", d.Name, "only the warehouse API serves the admin routes")
				found = true
				dir, key := path.Split(e.Value)
				var mounted bool
				for _, m := range ctr.VolumeMounts {
					if strings.TrimSuffix(m.MountPath, "/")+"/" != dir {
						continue
					}
					require.True(t, m.ReadOnly, "the token's volume is mounted read-only")
					for _, v := range spec.Volumes {
						if v.Name == m.Name {
							require.NotNil(t, v.Secret, "the token's volume is a Secret")
							require.Equal(t, "warehouse-admin", v.Secret.SecretName, "kustomization.yaml says to create warehouse-admin")
							require.Equal(t, "token", key, "kustomization.yaml creates the key token")
							require.NotNil(t, v.Secret.DefaultMode)
							require.Zero(t, *v.Secret.DefaultMode&0o007, "not readable by others")
							require.NotNil(t, spec.SecurityContext.FSGroup, "the nonroot process reads it through the pod's fsGroup")
							mounted = true
						}
					}
				}
				require.True(t, mounted, "Deployment %s: WAREHOUSE_ADMIN_TOKEN_FILE %s is in no Secret volume", d.Name, e.Value)
			}
		}
	}
	require.True(t, found, "the warehouse is given WAREHOUSE_ADMIN_TOKEN_FILE")
}

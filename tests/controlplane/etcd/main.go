// Command etcd is the etcd server used by kpssh's control-plane test tier.
// It lives in its own module because etcd's dependency pins differ from
// Kubernetes'; see ../go.mod and scripts/controlplane.sh.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}

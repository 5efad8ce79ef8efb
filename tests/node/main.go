// Command node is the binary of the E11 tier's two container images, selected by the name it
// runs as (argv[0]):
//
//   - pause: the pod sandbox. Holds the pod's namespaces, reaps orphans, exits 0 on SIGTERM or
//     SIGINT (what registry.k8s.io/pause does).
//   - app: the workload. Prints one line naming its pod, serves HTTP on $PORT (default 8080):
//     "/" answers "kpssh-e11 app <hostname>", which the pod's readiness probe reads; exits 0
//     on SIGTERM.
package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"
)

func main() {
	switch name := filepath.Base(os.Args[0]); name {
	case "pause":
		pause()
	case "app":
		app()
	default:
		fmt.Fprintf(os.Stderr, "node: run as pause or app, not %q\n", name)
		os.Exit(2)
	}
}

func pause() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sigs {
		if s == syscall.SIGCHLD {
			for {
				var ws syscall.WaitStatus
				pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
			continue
		}
		fmt.Fprintf(os.Stderr, "pause: %v, exiting\n", s)
		os.Exit(0)
	}
}

func app() {
	host, _ := os.Hostname()
	port := os.Getenv("PORT")
	if port == "" {
		port = "8080"
	}
	fmt.Printf("kpssh-e11 app %s listening on :%s\n", host, port)
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "kpssh-e11 app %s\n", host)
	})
	srv := &http.Server{Addr: ":" + port, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		<-ctx.Done()
		fmt.Println("kpssh-e11 app: terminating")
		shutdown, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	if err := srv.ListenAndServe(); err != nil && err != http.ErrServerClosed {
		fmt.Fprintf(os.Stderr, "app: %v\n", err)
		os.Exit(1)
	}
}

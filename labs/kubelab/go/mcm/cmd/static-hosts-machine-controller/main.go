// Command static-hosts-machine-controller is MCM's machine controller (pkg/util/provider/app, MCM's
// own library: drain, in-place update states, health, timeouts) with the static-hosts driver. It takes
// MCM's machine-controller flags plus --static-hosts-config (a JSON file, see statichosts.Config).
package main

import (
	"fmt"
	"os"

	"github.com/gardener/machine-controller-manager/pkg/util/provider/app"
	"github.com/gardener/machine-controller-manager/pkg/util/provider/app/options"
	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/component-base/cli/flag"
	"k8s.io/component-base/logs"

	"inplace-extension.invalid/kubelab/mcm/statichosts"
)

func main() {
	s := options.NewMCServer()
	s.AddFlags(pflag.CommandLine)
	configPath := pflag.CommandLine.String("static-hosts-config", "", "JSON file: {\"hosts\": [{\"name\", \"address\"}], \"nodeLabels\": {}}")
	flag.InitFlags()
	logs.InitLogs()
	defer logs.FlushLogs()
	if err := run(s, *configPath); err != nil {
		fmt.Fprintf(os.Stderr, "static-hosts-machine-controller: %v\n", err)
		os.Exit(1)
	}
}

func run(s *options.MCServer, configPath string) error {
	if configPath == "" {
		return fmt.Errorf("--static-hosts-config is required")
	}
	cfg, err := statichosts.LoadConfig(configPath)
	if err != nil {
		return err
	}
	// The Nodes live in the target cluster; MCM's own flag says where it is.
	rest, err := clientcmd.BuildConfigFromFlags("", s.TargetKubeconfig)
	if err != nil {
		return fmt.Errorf("target kubeconfig: %w", err)
	}
	client, err := kubernetes.NewForConfig(rest)
	if err != nil {
		return err
	}
	return app.Run(s, statichosts.New(cfg, client))
}

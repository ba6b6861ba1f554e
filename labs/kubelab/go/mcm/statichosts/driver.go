// Package statichosts is a machine-controller-manager driver for a fixed list of existing hosts
// (bare-metal pools, or kubelab's hostlab hosts): each Machine is backed by one free host of the list,
// and "creating" a machine creates its Node, named exactly like the Machine (MCM fails a Machine whose
// Node has another name). The Node carries the host's address as an annotation so a node-side updater
// can reach the host. Nothing is installed on the host: whatever runs there registers or keeps the
// Node (in kubelab: kwok, through the label type=kwok).
//
// A host may name the providerID its Node and Machine carry (providerID in its entry), so that the
// machine stands for an instance elsewhere: kubelab gives hosts the IDs of instances in an AWS API
// emulator (aws:///<zone>/<instance id>), which a node-side updater reads to tag that instance.
//
// The assignment Machine -> host lives only in the Nodes (label HostLabel), so the driver is stateless:
// a host is free when no Node carries its name. Deleting a Machine deletes its Node and frees the host.
package statichosts

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"sync"

	"github.com/gardener/machine-controller-manager/pkg/util/provider/driver"
	"github.com/gardener/machine-controller-manager/pkg/util/provider/machinecodes/codes"
	"github.com/gardener/machine-controller-manager/pkg/util/provider/machinecodes/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

const (
	// HostLabel names the host backing a Node; it is how the driver knows which hosts are taken.
	HostLabel = "static-hosts.inplace-extension.io/host"
	// AddressAnnotation is the host's address, read by inplace-extension's host resolution.
	AddressAnnotation = "inplace-extension.io/address"
	// ProviderPrefix starts every providerID this driver makes up: static:///<host name>, unless the
	// host's entry names its own.
	ProviderPrefix = "static:///"
)

// Host is one entry of the configured list.
type Host struct {
	Name    string `json:"name"`
	Address string `json:"address"`
	// ProviderID, when set, is the providerID of the host's Node and Machine instead of static:///<name>.
	ProviderID string `json:"providerID,omitempty"`
}

// Config is what the driver is started with.
type Config struct {
	Hosts []Host `json:"hosts"`
	// NodeLabels are put on every Node created (kubelab: type=kwok so kwok keeps the Node Ready).
	NodeLabels map[string]string `json:"nodeLabels,omitempty"`
}

// LoadConfig reads and checks a JSON config file.
func LoadConfig(path string) (Config, error) {
	var cfg Config
	data, err := os.ReadFile(path)
	if err != nil {
		return cfg, err
	}
	if err := json.Unmarshal(data, &cfg); err != nil {
		return cfg, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, cfg.Check()
}

// Check refuses an empty list, duplicate names, addresses that are not IP literals and providerIDs that
// are not <provider>://<id> or that two hosts share (two Machines would claim one instance).
func (c Config) Check() error {
	if len(c.Hosts) == 0 {
		return fmt.Errorf("static-hosts: no hosts configured")
	}
	seen := map[string]bool{}
	ids := map[string]bool{}
	for i, h := range c.Hosts {
		if h.Name == "" || seen[h.Name] {
			return fmt.Errorf("static-hosts: hosts[%d]: empty or duplicate name %q", i, h.Name)
		}
		seen[h.Name] = true
		if _, err := netip.ParseAddr(h.Address); err != nil {
			return fmt.Errorf("static-hosts: hosts[%d] (%s): address %q is not an IP literal", i, h.Name, h.Address)
		}
		if h.ProviderID == "" {
			continue
		}
		provider, id, found := strings.Cut(h.ProviderID, "://")
		if !found || provider == "" || strings.Trim(id, "/") == "" || ids[h.ProviderID] {
			return fmt.Errorf("static-hosts: hosts[%d] (%s): providerID %q is not <provider>://<id> or is another host's", i, h.Name, h.ProviderID)
		}
		ids[h.ProviderID] = true
	}
	return nil
}

// Driver implements MCM's driver.Driver on the target cluster's Nodes.
type Driver struct {
	cfg    Config
	client kubernetes.Interface
	mu     sync.Mutex // one host pick at a time: MCM runs several machine workers
}

var _ driver.Driver = (*Driver)(nil)

// New returns a driver for cfg that creates Nodes through client (the target cluster).
func New(cfg Config, client kubernetes.Interface) *Driver {
	return &Driver{cfg: cfg, client: client}
}

func providerID(host Host) string {
	if host.ProviderID != "" {
		return host.ProviderID
	}
	return ProviderPrefix + host.Name
}

func apiError(what string, err error) error {
	return status.WrapError(codes.Internal, fmt.Sprintf("static-hosts: %s: %v", what, err), err)
}

// CreateMachine picks a free host and creates the Node; an existing Node of the Machine is reused.
func (d *Driver) CreateMachine(ctx context.Context, req *driver.CreateMachineRequest) (*driver.CreateMachineResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	name := req.Machine.Name
	if node, err := d.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{}); err == nil {
		return &driver.CreateMachineResponse{ProviderID: node.Spec.ProviderID, NodeName: name}, nil
	} else if !apierrors.IsNotFound(err) {
		return nil, apiError("get node "+name, err)
	}
	nodes, err := d.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: HostLabel})
	if err != nil {
		return nil, apiError("list nodes", err)
	}
	taken := map[string]bool{}
	for _, n := range nodes.Items {
		taken[n.Labels[HostLabel]] = true
	}
	for _, host := range d.cfg.Hosts {
		if taken[host.Name] {
			continue
		}
		labels := map[string]string{HostLabel: host.Name, corev1.LabelHostname: name}
		for k, v := range d.cfg.NodeLabels {
			labels[k] = v
		}
		node := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{
				Name:        name,
				Labels:      labels,
				Annotations: map[string]string{AddressAnnotation: host.Address},
			},
			Spec: corev1.NodeSpec{ProviderID: providerID(host)},
		}
		if _, err := d.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			return nil, apiError("create node "+name, err)
		}
		return &driver.CreateMachineResponse{ProviderID: providerID(host), NodeName: name}, nil
	}
	return nil, status.Error(codes.ResourceExhausted, fmt.Sprintf("static-hosts: all %d hosts are taken", len(d.cfg.Hosts)))
}

// InitializeMachine is not needed: the hosts exist already.
func (d *Driver) InitializeMachine(context.Context, *driver.InitializeMachineRequest) (*driver.InitializeMachineResponse, error) {
	return nil, status.Error(codes.Unimplemented, "static-hosts: no initialization")
}

// DeleteMachine deletes the Node, which frees the host; a missing Node is success.
func (d *Driver) DeleteMachine(ctx context.Context, req *driver.DeleteMachineRequest) (*driver.DeleteMachineResponse, error) {
	err := d.client.CoreV1().Nodes().Delete(ctx, req.Machine.Name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, apiError("delete node "+req.Machine.Name, err)
	}
	return &driver.DeleteMachineResponse{}, nil
}

// GetMachineStatus answers NotFound until the Machine's Node exists (MCM then calls CreateMachine).
func (d *Driver) GetMachineStatus(ctx context.Context, req *driver.GetMachineStatusRequest) (*driver.GetMachineStatusResponse, error) {
	name := req.Machine.Name
	node, err := d.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, status.Error(codes.NotFound, "static-hosts: no node "+name)
	}
	if err != nil {
		return nil, apiError("get node "+name, err)
	}
	if _, ours := node.Labels[HostLabel]; !ours {
		return nil, status.Error(codes.NotFound, "static-hosts: node "+name+" is not backed by a static host")
	}
	return &driver.GetMachineStatusResponse{ProviderID: node.Spec.ProviderID, NodeName: name}, nil
}

// ListMachines reports nothing, so MCM's orphan collection never deletes a Node on its own.
func (d *Driver) ListMachines(context.Context, *driver.ListMachinesRequest) (*driver.ListMachinesResponse, error) {
	return &driver.ListMachinesResponse{MachineList: map[string]string{}}, nil
}

// GetVolumeIDs reports no volumes: the hosts have none that MCM manages.
func (d *Driver) GetVolumeIDs(context.Context, *driver.GetVolumeIDsRequest) (*driver.GetVolumeIDsResponse, error) {
	return &driver.GetVolumeIDsResponse{}, nil
}

package statichosts

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/gardener/machine-controller-manager/pkg/apis/machine/v1alpha1"
	"github.com/gardener/machine-controller-manager/pkg/util/provider/driver"
	"github.com/gardener/machine-controller-manager/pkg/util/provider/machinecodes/codes"
	"github.com/gardener/machine-controller-manager/pkg/util/provider/machinecodes/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

var twoHosts = Config{
	Hosts:      []Host{{Name: "h1", Address: "10.0.0.1"}, {Name: "h2", Address: "fd00::2"}},
	NodeLabels: map[string]string{"type": "kwok"},
}

func machine(name string) *v1alpha1.Machine {
	return &v1alpha1.Machine{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "machines"}}
}

func create(t *testing.T, d *Driver, name string) (*driver.CreateMachineResponse, error) {
	t.Helper()
	return d.CreateMachine(context.Background(), &driver.CreateMachineRequest{Machine: machine(name)})
}

func code(err error) codes.Code {
	s, _ := status.FromError(err)
	return s.Code()
}

// createTwo creates the machines m-a and m-b, in that order.
func createTwo(t *testing.T, d *Driver) (first, second *driver.CreateMachineResponse) {
	t.Helper()
	first, err := create(t, d, "m-a")
	if err != nil {
		t.Fatal(err)
	}
	second, err = create(t, d, "m-b")
	if err != nil {
		t.Fatal(err)
	}
	return first, second
}

func TestCreateBacksEachMachineByOneFreeHost(t *testing.T) {
	client := fake.NewClientset()
	d := New(twoHosts, client)
	first, second := createTwo(t, d)
	if first.NodeName != "m-a" || second.NodeName != "m-b" {
		t.Fatalf("node names %q %q, want the machine names", first.NodeName, second.NodeName)
	}
	if first.ProviderID != "static:///h1" || second.ProviderID != "static:///h2" {
		t.Fatalf("provider IDs %q %q", first.ProviderID, second.ProviderID)
	}
	node, err := client.CoreV1().Nodes().Get(context.Background(), "m-b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if node.Labels["type"] != "kwok" || node.Labels[HostLabel] != "h2" || node.Annotations[AddressAnnotation] != "fd00::2" {
		t.Fatalf("node metadata %v %v", node.Labels, node.Annotations)
	}
	if node.Spec.ProviderID != "static:///h2" {
		t.Fatalf("node providerID %q", node.Spec.ProviderID)
	}
	if _, err := create(t, d, "m-c"); code(err) != codes.ResourceExhausted {
		t.Fatalf("third machine on two hosts: %v, want ResourceExhausted", err)
	}
}

func TestAHostsOwnProviderIDIsItsNodesAndMachines(t *testing.T) {
	const instance = "aws:///eu-west-1a/i-0123456789abcdef0"
	cfg := Config{Hosts: []Host{{Name: "h1", Address: "10.0.0.1", ProviderID: instance}, {Name: "h2", Address: "10.0.0.2"}}}
	if err := cfg.Check(); err != nil {
		t.Fatal(err)
	}
	client := fake.NewClientset()
	d := New(cfg, client)
	first, second := createTwo(t, d)
	if first.ProviderID != instance || second.ProviderID != "static:///h2" {
		t.Fatalf("provider IDs %q %q, want the configured one and static:///h2", first.ProviderID, second.ProviderID)
	}
	node, err := client.CoreV1().Nodes().Get(context.Background(), "m-a", metav1.GetOptions{})
	if err != nil || node.Spec.ProviderID != instance || node.Labels[HostLabel] != "h1" {
		t.Fatalf("node m-a: %v %v", node, err)
	}
	got, err := d.GetMachineStatus(context.Background(), &driver.GetMachineStatusRequest{Machine: machine("m-a")})
	if err != nil || got.ProviderID != instance {
		t.Fatalf("status of m-a: %v %v", got, err)
	}
}

func TestCreateIsIdempotentAndDeleteFreesTheHost(t *testing.T) {
	client := fake.NewClientset()
	d := New(twoHosts, client)
	ctx := context.Background()
	if _, err := create(t, d, "m-a"); err != nil {
		t.Fatal(err)
	}
	again, err := create(t, d, "m-a")
	if err != nil || again.ProviderID != "static:///h1" {
		t.Fatalf("second create of m-a: %v %v", again, err)
	}
	if _, err := d.DeleteMachine(ctx, &driver.DeleteMachineRequest{Machine: machine("m-a")}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.DeleteMachine(ctx, &driver.DeleteMachineRequest{Machine: machine("m-a")}); err != nil {
		t.Fatalf("deleting a deleted machine: %v", err)
	}
	if _, err := create(t, d, "m-b"); err != nil {
		t.Fatal(err)
	}
	node, err := client.CoreV1().Nodes().Get(ctx, "m-b", metav1.GetOptions{})
	if err != nil || node.Labels[HostLabel] != "h1" {
		t.Fatalf("m-b should reuse the freed h1: %v %v", node, err)
	}
}

func TestGetMachineStatus(t *testing.T) {
	foreign := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "other"}}
	client := fake.NewClientset(foreign)
	d := New(twoHosts, client)
	ctx := context.Background()
	get := func(name string) (*driver.GetMachineStatusResponse, error) {
		return d.GetMachineStatus(ctx, &driver.GetMachineStatusRequest{Machine: machine(name)})
	}
	if _, err := get("m-a"); code(err) != codes.NotFound {
		t.Fatalf("before create: %v, want NotFound", err)
	}
	if _, err := get("other"); code(err) != codes.NotFound {
		t.Fatalf("a Node not made by the driver: %v, want NotFound", err)
	}
	if _, err := create(t, d, "m-a"); err != nil {
		t.Fatal(err)
	}
	got, err := get("m-a")
	if err != nil || got.NodeName != "m-a" || got.ProviderID != "static:///h1" {
		t.Fatalf("after create: %v %v", got, err)
	}
}

func TestAPIErrorsAreInternal(t *testing.T) {
	client := fake.NewClientset()
	client.PrependReactor("get", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewServiceUnavailable("down")
	})
	d := New(twoHosts, client)
	if _, err := create(t, d, "m-a"); code(err) != codes.Internal {
		t.Fatalf("create with the API down: %v, want Internal", err)
	}
	_, err := d.GetMachineStatus(context.Background(), &driver.GetMachineStatusRequest{Machine: machine("m-a")})
	if code(err) != codes.Internal {
		t.Fatalf("status with the API down: %v, want Internal", err)
	}
}

func TestListMachinesAndInitialize(t *testing.T) {
	d := New(twoHosts, fake.NewClientset())
	list, err := d.ListMachines(context.Background(), &driver.ListMachinesRequest{})
	if err != nil || len(list.MachineList) != 0 {
		t.Fatalf("list: %v %v", list, err)
	}
	_, err = d.InitializeMachine(context.Background(), &driver.InitializeMachineRequest{Machine: machine("m")})
	if code(err) != codes.Unimplemented {
		t.Fatalf("initialize: %v, want Unimplemented", err)
	}
}

func TestConfigCheck(t *testing.T) {
	bad := map[string]Config{
		"empty":                       {},
		"duplicate":                   {Hosts: []Host{{Name: "h", Address: "10.0.0.1"}, {Name: "h", Address: "10.0.0.2"}}},
		"hostname":                    {Hosts: []Host{{Name: "h", Address: "host.example"}}},
		"no name":                     {Hosts: []Host{{Address: "10.0.0.1"}}},
		"providerID without provider": {Hosts: []Host{{Name: "h", Address: "10.0.0.1", ProviderID: "i-0123"}}},
		"providerID without id":       {Hosts: []Host{{Name: "h", Address: "10.0.0.1", ProviderID: "aws:///"}}},
		"providerID of two hosts": {Hosts: []Host{
			{Name: "h1", Address: "10.0.0.1", ProviderID: "aws:///z/i-1"},
			{Name: "h2", Address: "10.0.0.2", ProviderID: "aws:///z/i-1"},
		}},
	}
	for what, cfg := range bad {
		if err := cfg.Check(); err == nil {
			t.Errorf("%s: accepted", what)
		}
	}
	path := filepath.Join(t.TempDir(), "hosts.json")
	if err := os.WriteFile(path, []byte(`{"hosts": [{"name": "h1", "address": "10.0.0.1"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfig(path)
	if err != nil || len(cfg.Hosts) != 1 {
		t.Fatalf("load: %v %v", cfg, err)
	}
	if err := os.WriteFile(path, []byte(`{"hosts": [`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadConfig(path); err == nil || errors.Is(err, os.ErrNotExist) {
		t.Fatalf("broken JSON: %v", err)
	}
}

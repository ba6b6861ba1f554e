// Command capa-lab-manager runs Cluster API Provider AWS's own AWSMachine controller and its webhooks for
// kubelab: a manager of the lab's own because CAPA's main.go imports its ROSA packages, which do not
// build from what the Go module proxy serves. Only what an AWSCluster managed outside CAPA needs is set
// up (the AWSCluster controller ignores such a cluster, so it is left out). The endpoint overrides are
// parsed and passed on as CAPA's main does with its --service-endpoints flag, but v2.8.4's AWSMachine
// controller does not hand them to the AWSCluster's scope (getInfraCluster builds that ClusterScope
// without Endpoints), so its EC2 calls would go to AWS itself: --aws-stand-in sends every request for an
// *.amazonaws.com host to a local stand-in of AWS (moto in the lab) instead, at the HTTP transport the AWS
// SDK uses.
package main

import (
	"flag"
	"net/http"
	"net/url"
	"os"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	infrav1 "sigs.k8s.io/cluster-api-provider-aws/v2/api/v1beta2"
	"sigs.k8s.io/cluster-api-provider-aws/v2/controllers"
	"sigs.k8s.io/cluster-api-provider-aws/v2/feature"
	"sigs.k8s.io/cluster-api-provider-aws/v2/pkg/cloud/endpoints"
	"sigs.k8s.io/cluster-api-provider-aws/v2/pkg/record"
	clusterv1 "sigs.k8s.io/cluster-api/api/v1beta1"
)

func main() {
	var (
		serviceEndpoints string
		webhookPort      int
		webhookCertDir   string
		healthAddr       string
		awsStandIn       string
	)
	flag.StringVar(&serviceEndpoints, "service-endpoints", "",
		"AWS service endpoints as CAPA's main takes them: ${SigningRegion}:${ServiceID}=${URL},...;...")
	flag.IntVar(&webhookPort, "webhook-port", 9443, "port of the webhook server")
	flag.StringVar(&webhookCertDir, "webhook-cert-dir", "", "directory holding tls.crt and tls.key")
	flag.StringVar(&healthAddr, "health-addr", "127.0.0.1:9440", "address of /healthz and /readyz")
	flag.StringVar(&awsStandIn, "aws-stand-in", "",
		"URL of a stand-in of AWS that gets every request for an *.amazonaws.com host (none: AWS itself)")
	klog.InitFlags(nil)
	flag.Parse()
	ctrl.SetLogger(klog.Background())
	setupLog := ctrl.Log.WithName("setup")

	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme, infrav1.AddToScheme, clusterv1.AddToScheme,
	} {
		if err := add(scheme); err != nil {
			setupLog.Error(err, "unable to build the scheme")
			os.Exit(1)
		}
	}

	awsServiceEndpoints, err := endpoints.ParseFlag(serviceEndpoints)
	if err != nil {
		setupLog.Error(err, "unable to parse service endpoints")
		os.Exit(1)
	}

	if awsStandIn != "" {
		target, err := url.Parse(awsStandIn)
		if err != nil || target.Host == "" {
			setupLog.Error(err, "unable to parse --aws-stand-in", "url", awsStandIn)
			os.Exit(1)
		}
		// The AWS SDK (v1) sends through http.DefaultClient. Given a CA bundle (AWS_CA_BUNDLE) it copies
		// the *http.Transport it finds there: with the redirect as the client's own Transport that copy
		// fails and says so, where a redirect only in DefaultTransport would be bypassed without a word.
		redirect := awsRedirect{target: target, next: http.DefaultTransport}
		http.DefaultTransport = redirect
		http.DefaultClient.Transport = redirect
	}

	ctx := ctrl.SetupSignalHandler()
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: healthAddr,
		WebhookServer:          webhook.NewServer(webhook.Options{Host: "127.0.0.1", Port: webhookPort, CertDir: webhookCertDir}),
	})
	if err != nil {
		setupLog.Error(err, "unable to start manager")
		os.Exit(1)
	}
	record.InitFromRecorder(mgr.GetEventRecorderFor("aws-controller"))

	if err := (&controllers.AWSMachineReconciler{
		Client:                       mgr.GetClient(),
		Log:                          ctrl.Log.WithName("controllers").WithName("AWSMachine"),
		Recorder:                     mgr.GetEventRecorderFor("awsmachine-controller"),
		Endpoints:                    awsServiceEndpoints,
		TagUnmanagedNetworkResources: feature.Gates.Enabled(feature.TagUnmanagedNetworkResources),
	}).SetupWithManager(ctx, mgr, controller.Options{MaxConcurrentReconciles: 2, RecoverPanic: ptr.To(true)}); err != nil {
		setupLog.Error(err, "unable to create controller", "controller", "AWSMachine")
		os.Exit(1)
	}
	// CAPA's own defaulting and validating webhooks of the kinds the lab uses
	for name, setup := range map[string]func(ctrl.Manager) error{
		"AWSMachine":         (&infrav1.AWSMachine{}).SetupWebhookWithManager,
		"AWSMachineTemplate": (&infrav1.AWSMachineTemplateWebhook{}).SetupWebhookWithManager,
		"AWSCluster":         (&infrav1.AWSCluster{}).SetupWebhookWithManager,
	} {
		if err := setup(mgr); err != nil {
			setupLog.Error(err, "unable to create webhook", "webhook", name)
			os.Exit(1)
		}
	}
	if err := mgr.AddReadyzCheck("webhook", mgr.GetWebhookServer().StartedChecker()); err != nil {
		setupLog.Error(err, "unable to create ready check")
		os.Exit(1)
	}
	if err := mgr.AddHealthzCheck("webhook", mgr.GetWebhookServer().StartedChecker()); err != nil {
		setupLog.Error(err, "unable to create health check")
		os.Exit(1)
	}
	if err := mgr.Start(ctx); err != nil {
		setupLog.Error(err, "problem running manager")
		os.Exit(1)
	}
}

// awsRedirect sends requests for AWS hosts to the stand-in at target, keeping the Host header (the
// request was signed for it) and the path; any other request goes on unchanged.
type awsRedirect struct {
	target *url.URL
	next   http.RoundTripper
}

func (r awsRedirect) RoundTrip(req *http.Request) (*http.Response, error) {
	if !strings.HasSuffix(req.URL.Hostname(), ".amazonaws.com") {
		return r.next.RoundTrip(req)
	}
	out := req.Clone(req.Context())
	out.Host = req.URL.Host
	out.URL.Scheme, out.URL.Host = r.target.Scheme, r.target.Host
	return r.next.RoundTrip(out)
}

package main

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

const readyTimeout = 120 * time.Second

// runAPIServer serves etcd and kube-apiserver on loopback until SIGTERM or the end of stdin.
func runAPIServer(args []string) error {
	flags := flag.NewFlagSet("apiserver", flag.ContinueOnError)
	dir := flags.String("dir", "", "state dir: etcd data, certificates, tokens, kubeconfigs")
	serviceAccount := flags.String("service-account", "kube-system/rbln-device-plugin",
		"NS/NAME: the identity of worker.kubeconfig, a service account as RBAC sees it")
	verbosity := flags.Int("v", 1, "kube-apiserver's log verbosity")
	fixedPort := flags.Int("port", 0, "the secure port; 0: a free one. With -dir of an earlier run (its etcd data "+
		"and credentials kept), a restart of that API server")
	profiling := flags.Bool("profiling", false, "serve /debug/pprof (bench/dra_fleet.py --profile: where the CPU goes)")
	if err := flags.Parse(args); err != nil {
		return err
	}
	if *dir == "" {
		return errors.New("-dir is required")
	}
	namespace, name, ok := strings.Cut(*serviceAccount, "/")
	if !ok || namespace == "" || name == "" {
		return fmt.Errorf("-service-account %q is not NS/NAME", *serviceAccount)
	}
	etcd, err := startEtcd(filepath.Join(*dir, "etcd"))
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	defer etcd.Close()

	port := *fixedPort
	if port == 0 {
		if port, err = freePort(); err != nil {
			return err
		}
	}
	server := fmt.Sprintf("https://127.0.0.1:%d", port)
	files, err := credentialsOf(*dir, namespace, name)
	if err != nil {
		return err
	}
	command := app.NewAPIServerCommand()
	command.SetArgs([]string{
		"--etcd-servers=" + etcd.Clients[0].Addr().(*net.TCPAddr).String(),
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port=" + strconv.Itoa(port),
		"--tls-cert-file=" + files.cert, "--tls-private-key-file=" + files.key, "--cert-dir=" + filepath.Join(*dir, "certs"),
		"--token-auth-file=" + files.tokens, "--anonymous-auth=false", "--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc", "--service-account-key-file=" + files.serviceAccountKey,
		"--service-account-signing-key-file=" + files.serviceAccountKey, "--service-cluster-ip-range=10.0.0.0/24",
		"--endpoint-reconciler-type=none", "--enable-priority-and-fairness=false",
		"--profiling=" + strconv.FormatBool(*profiling),
		"--v=" + strconv.Itoa(*verbosity),
	})
	served := make(chan error, 1)
	go func() { served <- command.Execute() }()

	admin := filepath.Join(*dir, "admin.kubeconfig")
	worker := filepath.Join(*dir, "worker.kubeconfig")
	if err := writeKubeconfig(admin, server, files.caPEM, files.adminToken); err != nil {
		return err
	}
	if err := writeKubeconfig(worker, server, files.caPEM, files.workerToken); err != nil {
		return err
	}
	if err := waitReady(admin, served); err != nil {
		return err
	}
	ready, _ := json.Marshal(map[string]any{"ready": true, "server": server, "kubeconfig": admin,
		"workerKubeconfig": worker, "workerUser": serviceAccountUser(namespace, name)})
	fmt.Println(string(ready))

	// The end of stdin stops the server as SIGTERM does: kube-apiserver's own signal handler shuts it down.
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		_ = syscall.Kill(os.Getpid(), syscall.SIGTERM)
	}()
	return <-served
}

func startEtcd(dir string) (*embed.Etcd, error) {
	cfg := embed.NewConfig()
	cfg.Dir = dir
	cfg.LogLevel = "error"
	cfg.UnsafeNoFsync = true // a test's data, gone with the test
	clientPort, err := freePort()
	if err != nil {
		return nil, err
	}
	peerPort, err := freePort()
	if err != nil {
		return nil, err
	}
	client := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", clientPort)}
	peer := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", peerPort)}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	etcd, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, err
	}
	select {
	case <-etcd.Server.ReadyNotify():
		return etcd, nil
	case err := <-etcd.Err():
		etcd.Close()
		return nil, err
	case <-time.After(readyTimeout):
		etcd.Close()
		return nil, fmt.Errorf("not ready within %v", readyTimeout)
	}
}

// freePort is a loopback port nobody listens on now; the server that takes it listens moments later.
func freePort() (int, error) {
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer listener.Close()
	return listener.Addr().(*net.TCPAddr).Port, nil
}

type credentials struct {
	cert, key, tokens, serviceAccountKey string
	caPEM                                []byte
	adminToken, workerToken              string
}

func serviceAccountUser(namespace, name string) string {
	return fmt.Sprintf("system:serviceaccount:%s:%s", namespace, name)
}

// credentialsOf reads the credentials an earlier run wrote into dir, or makes them (writeCredentials).
func credentialsOf(dir, namespace, name string) (credentials, error) {
	files := credentials{cert: filepath.Join(dir, "apiserver.crt"), key: filepath.Join(dir, "apiserver.key"),
		tokens: filepath.Join(dir, "tokens.csv"), serviceAccountKey: filepath.Join(dir, "service-account.key")}
	tokens, err := os.ReadFile(files.tokens)
	if errors.Is(err, os.ErrNotExist) {
		return writeCredentials(dir, namespace, name)
	} else if err != nil {
		return files, err
	}
	if files.caPEM, err = os.ReadFile(files.cert); err != nil {
		return files, err
	}
	lines := strings.Split(strings.TrimSpace(string(tokens)), "\n")
	if len(lines) != 2 {
		return files, fmt.Errorf("%s: %d lines, not 2", files.tokens, len(lines))
	}
	files.adminToken, _, _ = strings.Cut(lines[0], ",")
	files.workerToken, _, _ = strings.Cut(lines[1], ",")
	return files, nil
}

// writeCredentials makes the serving certificate (its CA goes into the kubeconfigs), the service account
// signing key and two bearer tokens: an administrator's and the worker's, whose user and groups are those
// a token of the service account NS/NAME authenticates as, so the chart's ClusterRoleBinding applies.
func writeCredentials(dir, namespace, name string) (credentials, error) {
	files := credentials{cert: filepath.Join(dir, "apiserver.crt"), key: filepath.Join(dir, "apiserver.key"),
		tokens: filepath.Join(dir, "tokens.csv"), serviceAccountKey: filepath.Join(dir, "service-account.key")}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return files, err
	}
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey("127.0.0.1", []net.IP{net.ParseIP("127.0.0.1")},
		[]string{"localhost"})
	if err != nil {
		return files, err
	}
	files.caPEM = certPEM // the serving certificate, then the CA that signed it
	signingKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return files, err
	}
	saPEM := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(signingKey)})
	files.adminToken, files.workerToken = randomToken(), randomToken()
	tokens := fmt.Sprintf("%s,admin,admin,system:masters\n%s,%s,worker,\"system:serviceaccounts,system:serviceaccounts:%s\"\n",
		files.adminToken, files.workerToken, serviceAccountUser(namespace, name), namespace)
	for path, content := range map[string][]byte{files.cert: certPEM, files.key: keyPEM,
		files.serviceAccountKey: saPEM, files.tokens: []byte(tokens)} {
		if err := os.WriteFile(path, content, 0o600); err != nil {
			return files, err
		}
	}
	return files, nil
}

func randomToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%x", b)
}

func writeKubeconfig(path, server string, caPEM []byte, token string) error {
	config := clientcmdapi.NewConfig()
	config.Clusters["dra"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	config.AuthInfos["dra"] = &clientcmdapi.AuthInfo{Token: token}
	config.Contexts["dra"] = &clientcmdapi.Context{Cluster: "dra", AuthInfo: "dra"}
	config.CurrentContext = "dra"
	return clientcmd.WriteToFile(*config, path)
}

// waitReady polls /readyz with the administrator's kubeconfig until it answers ok.
func waitReady(kubeconfig string, served <-chan error) error {
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(rest.CopyConfig(config))
	if err != nil {
		return err
	}
	deadline := time.Now().Add(readyTimeout)
	for {
		select {
		case err := <-served:
			return fmt.Errorf("kube-apiserver ended before it was ready: %v", err)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		body, err := client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		cancel()
		if err == nil && string(body) == "ok" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kube-apiserver not ready within %v: %v %s", readyTimeout, err, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

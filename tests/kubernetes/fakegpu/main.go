// Command fake-gpu-plugin is a kubelet device plugin (device plugin API v1beta1) that
// advertises a number of fake, always healthy GPUs, so that a real kubelet on a machine
// without GPUs offers an extended resource such as nvidia.com/gpu and hands pods the
// CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES a GPU node would give them.
//
// What it does:
//   - serves the DevicePlugin gRPC service on a unix socket in the kubelet's device-plugin
//     directory (<kubelet --root-dir>/device-plugins) and registers it with the kubelet's
//     Registration service (kubelet.sock in that directory);
//   - ListAndWatch: the devices <id-prefix>0 .. <id-prefix>N-1, all Healthy;
//   - Allocate: for every container, CUDA_VISIBLE_DEVICES and NVIDIA_VISIBLE_DEVICES set to
//     the allocated devices' indices ("0,3"), sorted, and FAKE_GPU_DEVICE_IDS to their IDs;
//   - watches both sockets: a restarted kubelet wipes the directory (our socket vanishes) and
//     creates a new kubelet.sock, and either makes the plugin serve and register again.
//
// It exits (status 0) on SIGTERM or SIGINT, removing its socket.
//
// Built by scripts/k8s_build.sh in GOPATH mode against the packages vendored in Kubernetes'
// own source tree (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1, google.golang.org/grpc).
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type plugin struct {
	resource string
	prefix   string
	count    int
	// closed when the gRPC server serving this plugin is being stopped: ends ListAndWatch.
	stop chan struct{}
}

func (p *plugin) devices() []*pluginapi.Device {
	devs := make([]*pluginapi.Device, 0, p.count)
	for i := 0; i < p.count; i++ {
		devs = append(devs, &pluginapi.Device{ID: p.prefix + strconv.Itoa(i), Health: pluginapi.Healthy})
	}
	return devs
}

func (p *plugin) index(id string) (int, error) {
	if !strings.HasPrefix(id, p.prefix) {
		return 0, fmt.Errorf("unknown device %q", id)
	}
	i, err := strconv.Atoi(strings.TrimPrefix(id, p.prefix))
	if err != nil || i < 0 || i >= p.count {
		return 0, fmt.Errorf("unknown device %q", id)
	}
	return i, nil
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (p *plugin) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: p.devices()}); err != nil {
		return err
	}
	log.Printf("ListAndWatch: reported %d healthy %s devices", p.count, p.resource)
	// The devices never change: hold the stream open until the kubelet or we go away.
	select {
	case <-stream.Context().Done():
	case <-p.stop:
	}
	return nil
}

func (p *plugin) GetPreferredAllocation(context.Context, *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	// Not advertised in the options, so the kubelet does not call it.
	return &pluginapi.PreferredAllocationResponse{}, nil
}

func (p *plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, creq := range req.ContainerRequests {
		indices := make([]int, 0, len(creq.DevicesIDs))
		for _, id := range creq.DevicesIDs {
			i, err := p.index(id)
			if err != nil {
				return nil, err
			}
			indices = append(indices, i)
		}
		sort.Ints(indices)
		names := make([]string, len(indices))
		ids := make([]string, len(indices))
		for k, i := range indices {
			names[k] = strconv.Itoa(i)
			ids[k] = p.prefix + strconv.Itoa(i)
		}
		visible := strings.Join(names, ",")
		log.Printf("Allocate: %s -> CUDA_VISIBLE_DEVICES=%s", strings.Join(creq.DevicesIDs, ","), visible)
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{
				"CUDA_VISIBLE_DEVICES":   visible,
				"NVIDIA_VISIBLE_DEVICES": visible,
				"FAKE_GPU_DEVICE_IDS":    strings.Join(ids, ","),
			},
		})
	}
	return resp, nil
}

func (p *plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// inode of a path, 0 when it does not exist: how a replaced socket is told from the old one.
func inode(path string) uint64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 0
}

// A killed kubelet leaves its socket file behind: only a socket that accepts connections
// belongs to a live kubelet.
func listening(path string) bool {
	conn, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return false
	}
	conn.Close()
	return true
}

func dialUnix(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "unix", addr)
}

func register(kubeletSocket, endpoint, resource string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := grpc.DialContext(ctx, kubeletSocket, grpc.WithInsecure(), grpc.WithBlock(), grpc.WithContextDialer(dialUnix))
	if err != nil {
		return fmt.Errorf("connect to %s: %v", kubeletSocket, err)
	}
	defer conn.Close()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     endpoint,
		ResourceName: resource,
		Options:      &pluginapi.DevicePluginOptions{},
	})
	return err
}

func main() {
	dir := flag.String("kubelet-dir", pluginapi.DevicePluginPath, "the kubelet's device-plugin directory (<--root-dir>/device-plugins), holding kubelet.sock")
	resource := flag.String("resource", "nvidia.com/gpu", "extended resource name to advertise")
	count := flag.Int("count", 8, "number of fake devices")
	endpoint := flag.String("socket", "fake-gpu.sock", "file name of this plugin's socket in -kubelet-dir")
	prefix := flag.String("id-prefix", "fake-gpu-", "device IDs are this prefix followed by the index")
	flag.Parse()
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	if *count < 0 || strings.Contains(*endpoint, "/") {
		log.Fatalf("bad arguments: -count %d -socket %q", *count, *endpoint)
	}

	kubeletSocket := filepath.Join(*dir, "kubelet.sock")
	ownSocket := filepath.Join(*dir, *endpoint)
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()

	var (
		server     *grpc.Server
		p          *plugin
		ownIno     uint64 // inode of our socket while serving
		kubeletIno uint64 // inode of the kubelet.sock we registered with
		lastErr    string
	)
	stopServing := func() {
		if server == nil {
			return
		}
		close(p.stop)
		server.Stop()
		server, p = nil, nil
		if inode(ownSocket) == ownIno {
			os.Remove(ownSocket)
		}
	}
	logOnce := func(msg string) {
		if msg != lastErr {
			log.Print(msg)
			lastErr = msg
		}
	}

	for {
		if server != nil && (inode(ownSocket) != ownIno || inode(kubeletSocket) != kubeletIno) {
			log.Print("kubelet restarted (socket replaced or removed): serving and registering again")
			stopServing()
		}
		if server == nil {
			if !listening(kubeletSocket) {
				logOnce("waiting for the kubelet at " + kubeletSocket)
			} else {
				os.Remove(ownSocket)
				lis, err := net.Listen("unix", ownSocket)
				if err != nil {
					logOnce(fmt.Sprintf("listen on %s: %v", ownSocket, err))
				} else {
					p = &plugin{resource: *resource, prefix: *prefix, count: *count, stop: make(chan struct{})}
					server = grpc.NewServer()
					pluginapi.RegisterDevicePluginServer(server, p)
					go server.Serve(lis)
					ownIno = inode(ownSocket)
					if err := register(kubeletSocket, *endpoint, *resource); err != nil {
						logOnce(fmt.Sprintf("register with kubelet: %v", err))
						stopServing()
					} else {
						// The socket we reached: a kubelet that restarts from now on replaces it.
						kubeletIno = inode(kubeletSocket)
						lastErr = ""
						log.Printf("registered %s (%d devices) with %s, serving on %s", *resource, *count, kubeletSocket, ownSocket)
					}
				}
			}
		}
		select {
		case s := <-signals:
			log.Printf("%v: exiting", s)
			stopServing()
			return
		case <-tick.C:
		}
	}
}

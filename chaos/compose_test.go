package chaos

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeDocker records the commands the compose target runs and answers them.
type fakeDocker struct {
	mu       sync.Mutex
	commands []string
	answer   func(cmd string) (string, error)
}

func (f *fakeDocker) exec(_ context.Context, name string, args ...string) ([]byte, error) {
	cmd := name + " " + strings.Join(args, " ")
	f.mu.Lock()
	f.commands = append(f.commands, cmd)
	answer := f.answer
	f.mu.Unlock()
	if answer == nil {
		return nil, nil
	}
	out, err := answer(cmd)
	return []byte(out), err
}

func (f *fakeDocker) take() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.commands
	f.commands = nil
	return c
}

type composeBundle struct {
	target   *Compose
	docker   *fakeDocker
	file     string
	override string
	ready    *[]string
}

// writeAdminToken writes the admin token file of a compose file in dir.
func writeAdminToken(t *testing.T, dir string) {
	t.Helper()
	path := filepath.Join(dir, ComposeAdminTokenFile)
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, []byte("compose-test-admin-token\n"), 0o644))
}

func setupCompose(t *testing.T, ports map[string]int) composeBundle {
	t.Helper()
	dir := t.TempDir()
	file := filepath.Join(dir, "docker-compose.yml")
	require.NoError(t, os.WriteFile(file, []byte("services: {}\n"), 0o644))
	writeAdminToken(t, dir)
	docker := &fakeDocker{}
	var mu sync.Mutex
	ready := []string{}
	c := NewCompose(ComposeConfig{
		File: file, Project: "chaos-test", Exec: docker.exec, OverrideDir: dir, Ports: ports,
		Ready: func(_ context.Context, url string) error {
			mu.Lock()
			defer mu.Unlock()
			ready = append(ready, url)
			return nil
		},
	})
	require.NoError(t, c.Prepare(context.Background(), func(string) {}))
	return composeBundle{target: c, docker: docker, file: file, override: filepath.Join(dir, "chaos.override.yml"), ready: &ready}
}

func TestCompose(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("PrepareChecksTheEngineAndBuilds", func(t *testing.T) {
		t.Parallel()
		b := setupCompose(t, nil)
		require.Equal(t, []string{
			"docker info --format {{.ServerVersion}}",
			"docker compose -p chaos-test -f " + b.file + " -f " + b.override + " build warehouse orders-api warehouse-relay orders-relay",
		}, b.docker.take())
	})

	t.Run("PrepareWithoutAnEngineFails", func(t *testing.T) {
		t.Parallel()
		file := filepath.Join(t.TempDir(), "docker-compose.yml")
		require.NoError(t, os.WriteFile(file, nil, 0o644))
		docker := &fakeDocker{answer: func(string) (string, error) { return "", os.ErrNotExist }}
		c := NewCompose(ComposeConfig{File: file, Exec: docker.exec, OverrideDir: t.TempDir()})
		require.ErrorContains(t, c.Prepare(ctx, func(string) {}), "no Docker engine")
	})

	t.Run("StartShopArmsCrashPointsThroughTheOverrideFile", func(t *testing.T) {
		t.Parallel()
		b := setupCompose(t, map[string]int{"postgres": 15432, "rabbitmq": 15673})
		b.docker.take()
		eps, err := b.target.StartShop(ctx, ShopSpec{Name: "relay-after-publish", Failpoints: map[Service]string{OrdersRelay: "relay.after-publish=kill@30"}})
		require.NoError(t, err)
		base := "docker compose -p chaos-test -f " + b.file + " -f " + b.override
		require.Equal(t, []string{
			base + " down -v --remove-orphans",
			base + " up -d --wait postgres rabbitmq warehouse orders-api warehouse-relay orders-relay",
		}, b.docker.take(), "the stack without its own loadgen, whose orders no scenario could account for")
		override, err := os.ReadFile(b.override)
		require.NoError(t, err)
		require.Contains(t, string(override), "  orders-relay:\n    restart: \"no\"\n    environment:\n      CHAOS_FAILPOINTS: \"relay.after-publish=kill@30\"\n",
			"armed, and not restarted by Docker with the crash point still armed")
		require.Contains(t, string(override), "  warehouse:\n    restart: \"no\"\n    environment:\n      CHAOS_FAILPOINTS: \"\"\n", "every other service is disarmed")
		require.Contains(t, string(override), "  postgres:\n    ports:\n      - \"127.0.0.1:15432:5432\"\n", "the runner reaches the databases")
		require.Contains(t, string(override), "  rabbitmq:\n    ports:\n      - \"127.0.0.1:15673:5672\"\n", "and the broker")
		require.Equal(t, []string{"http://127.0.0.1:8090/readyz", "http://127.0.0.1:8080/readyz"}, *b.ready,
			"the published APIs; up --wait waited for the relays' healthchecks")
		require.Equal(t, "http://127.0.0.1:8080", eps.OrdersURL)
		require.Equal(t, "http://127.0.0.1:8090", eps.StockURL)
		require.Equal(t, "postgres://postgres:postgres@127.0.0.1:15432/orders?sslmode=disable", eps.OrdersDB)
		require.Equal(t, "postgres://postgres:postgres@127.0.0.1:15432/warehouse?sslmode=disable", eps.WarehouseDB)
		require.Equal(t, "amqp://guest:guest@127.0.0.1:15673/", eps.AMQPURL)
		require.Equal(t, map[Service]string{OrdersAPI: "http://127.0.0.1:8080/metrics", Warehouse: "http://127.0.0.1:8090/metrics"}, eps.Metrics)
	})

	t.Run("WaitDeathReadsPS", func(t *testing.T) {
		t.Parallel()
		for name, ps := range map[string]string{
			"NDJSON": `{"Service":"orders-relay","State":"exited","ExitCode":137,"Status":"Exited (137) 1 second ago"}` + "\n",
			"Array":  `[{"Service":"orders-relay","State":"exited","ExitCode":137,"Status":"Exited (137) 1 second ago"}]`,
		} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				b := setupCompose(t, nil)
				calls := 0
				b.docker.mu.Lock()
				b.docker.answer = func(cmd string) (string, error) {
					if !strings.Contains(cmd, " ps -a --format json orders-relay") {
						return "", nil
					}
					calls++
					if calls < 3 {
						return `{"Service":"orders-relay","State":"running","ExitCode":0}`, nil
					}
					return ps, nil
				}
				b.docker.mu.Unlock()
				d, err := b.target.WaitDeath(ctx, OrdersRelay)
				require.NoError(t, err)
				require.True(t, d.Killed, "exit code 137 is SIGKILL")
				require.Equal(t, OrdersRelay, d.Service)
				require.Len(t, b.target.Deaths(), 1)
			})
		}
	})

	t.Run("WaitDeathTellsAnotherEnd", func(t *testing.T) {
		t.Parallel()
		b := setupCompose(t, nil)
		b.docker.mu.Lock()
		b.docker.answer = func(string) (string, error) {
			return `{"Service":"warehouse","State":"exited","ExitCode":1,"Status":"Exited (1)"}`, nil
		}
		b.docker.mu.Unlock()
		d, err := b.target.WaitDeath(ctx, Warehouse)
		require.NoError(t, err)
		require.False(t, d.Killed)
	})

	t.Run("HealRecreatesWithoutTheCrashPoint", func(t *testing.T) {
		t.Parallel()
		b := setupCompose(t, nil)
		_, err := b.target.StartShop(ctx, ShopSpec{Name: "x", Failpoints: map[Service]string{Warehouse: "consumer.after-commit=kill@60"}})
		require.NoError(t, err)
		b.docker.take()
		require.NoError(t, b.target.Heal(ctx, Warehouse))
		require.Equal(t, []string{"docker compose -p chaos-test -f " + b.file + " -f " + b.override +
			" up -d --wait --force-recreate --no-deps warehouse"}, b.docker.take())
		override, err := os.ReadFile(b.override)
		require.NoError(t, err)
		require.NotContains(t, string(override), "consumer.after-commit")
		require.Equal(t, "http://127.0.0.1:8090/readyz", (*b.ready)[len(*b.ready)-1])
	})

	t.Run("ConfigureAndExec", func(t *testing.T) {
		t.Parallel()
		// contract-change's deploys: a setting of one service, after the shop's, on its next
		// start; its command run in its running container.
		sc, ok := Lookup("contract-change")
		require.True(t, ok)
		b := setupCompose(t, nil)
		_, err := b.target.StartShop(ctx, sc.shopSpec())
		require.NoError(t, err)
		override, err := os.ReadFile(b.override)
		require.NoError(t, err)
		require.Contains(t, string(override), `WAREHOUSE_ORDER_CREATED_VERSIONS: "1"`)
		b.docker.take()
		require.NoError(t, b.target.Configure(Warehouse, "WAREHOUSE_ORDER_CREATED_VERSIONS=1,2"))
		require.ErrorContains(t, b.target.Configure(Warehouse, "NOT A SETTING"), "is not NAME=value")
		require.Empty(t, b.docker.take(), "nothing changes before the next start")
		require.NoError(t, b.target.StartService(ctx, Warehouse))
		require.Equal(t, []string{"docker compose -p chaos-test -f " + b.file + " -f " + b.override +
			" up -d --wait --force-recreate --no-deps warehouse"}, b.docker.take())
		override, err = os.ReadFile(b.override)
		require.NoError(t, err)
		warehouse, others, ok := strings.Cut(string(override), "  warehouse:\n")
		require.True(t, ok)
		warehouse, _, _ = strings.Cut(others, "\n  orders-api:")
		require.Equal(t, 1, strings.Count(warehouse, "WAREHOUSE_ORDER_CREATED_VERSIONS"), "the last value only:\n%s", warehouse)
		require.Contains(t, warehouse, `WAREHOUSE_ORDER_CREATED_VERSIONS: "1,2"`)
		require.Equal(t, 3, strings.Count(string(override), `WAREHOUSE_ORDER_CREATED_VERSIONS: "1"`), "the other services keep the shop's")

		_, err = b.target.Exec(ctx, Warehouse, "dead-letters", "--dry-run")
		require.NoError(t, err)
		require.Equal(t, []string{"docker compose -p chaos-test -f " + b.file + " -f " + b.override +
			" exec -T warehouse /app dead-letters --dry-run"}, b.docker.take())
	})

	t.Run("KillAndRestartComponents", func(t *testing.T) {
		t.Parallel()
		// Restart waits until the component's port answers: a listener of the test's.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		t.Cleanup(func() { _ = ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				_ = c.Close()
			}
		}()
		port, _ := strconv.Atoi(strings.TrimPrefix(ln.Addr().String(), "127.0.0.1:"))
		b := setupCompose(t, map[string]int{"rabbitmq": port, "postgres": port})
		b.docker.take()
		base := "docker compose -p chaos-test -f " + b.file + " -f " + b.override
		require.NoError(t, b.target.Kill(ctx, Broker))
		require.NoError(t, b.target.Restart(ctx, Broker))
		require.NoError(t, b.target.Kill(ctx, OrdersDB))
		require.NoError(t, b.target.Restart(ctx, OrdersDB))
		require.Equal(t, []string{
			base + " kill -s SIGKILL rabbitmq", base + " start rabbitmq",
			base + " kill -s SIGKILL postgres", base + " start postgres",
		}, b.docker.take())
		require.ErrorIs(t, b.target.Kill(ctx, Component("redis")), ErrUnsupported)
	})

	t.Run("CredentialsAndFreePorts", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		file := filepath.Join(dir, "docker-compose.yml")
		require.NoError(t, os.WriteFile(file, nil, 0o644))
		writeAdminToken(t, dir)
		docker := &fakeDocker{}
		c := NewCompose(ComposeConfig{
			File: file, Exec: docker.exec, OverrideDir: dir, Ready: func(context.Context, string) error { return nil },
			PostgresUser: "shop", PostgresPassword: "s3cret", AMQPUser: "bunny", AMQPPassword: "carrot",
		})
		require.NoError(t, c.Prepare(ctx, func(string) {}))
		eps, err := c.StartShop(ctx, ShopSpec{Name: "x"})
		require.NoError(t, err)
		require.Regexp(t, `^postgres://shop:s3cret@127\.0\.0\.1:\d+/orders\?sslmode=disable$`, eps.OrdersDB)
		require.Regexp(t, `^amqp://bunny:carrot@127\.0\.0\.1:\d+/$`, eps.AMQPURL)
		require.NotContains(t, eps.OrdersDB, ":0/", "a free port was chosen")
		require.Equal(t, "compose-test-admin-token", eps.AdminToken, "the token of the compose file's secret, its newline trimmed")
	})

	t.Run("NetworkFaultsAreNotSupported", func(t *testing.T) {
		t.Parallel()
		b := setupCompose(t, nil)
		require.ErrorIs(t, b.target.CutNetwork(ctx), ErrUnsupported)
		require.ErrorIs(t, b.target.DelayNetwork(ctx, 1), ErrUnsupported)
		require.NoError(t, b.target.HealNetwork(ctx))
	})

	t.Run("LogsStopAndClose", func(t *testing.T) {
		t.Parallel()
		b := setupCompose(t, nil)
		b.docker.take()
		b.docker.mu.Lock()
		b.docker.answer = func(cmd string) (string, error) { return "line\n", nil }
		b.docker.mu.Unlock()
		logs, err := b.target.Logs(ctx, OrdersAPI)
		require.NoError(t, err)
		require.Equal(t, "line\n", logs)
		require.NoError(t, b.target.StopShop(ctx))
		require.NoError(t, b.target.Close())
		base := "docker compose -p chaos-test -f " + b.file + " -f " + b.override
		require.Equal(t, []string{
			base + " logs --no-color --no-log-prefix orders-api",
			base + " down -v --remove-orphans",
			base + " down -v --remove-orphans",
		}, b.docker.take())
	})
}

func TestComposeOperations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("SettingsGoToEveryService", func(t *testing.T) {
		t.Parallel()
		b := setupCompose(t, nil)
		_, err := b.target.StartShop(ctx, ShopSpec{Name: "x", Settings: []string{"WAREHOUSE_QUEUE_DELIVERY_LIMIT=2", "ORDERS_RELAY_PUBLISH_TIMEOUT=5s"}})
		require.NoError(t, err)
		override, err := os.ReadFile(b.override)
		require.NoError(t, err)
		require.Contains(t, string(override), "  orders-relay:\n    restart: \"no\"\n    environment:\n      CHAOS_FAILPOINTS: \"\"\n"+
			"      WAREHOUSE_QUEUE_DELIVERY_LIMIT: \"2\"\n      ORDERS_RELAY_PUBLISH_TIMEOUT: \"5s\"\n")
		require.Equal(t, 4, strings.Count(string(override), "WAREHOUSE_QUEUE_DELIVERY_LIMIT"))

		// A heal keeps them.
		require.NoError(t, b.target.Heal(ctx, OrdersRelay))
		override, err = os.ReadFile(b.override)
		require.NoError(t, err)
		require.Equal(t, 4, strings.Count(string(override), "ORDERS_RELAY_PUBLISH_TIMEOUT"))
	})

	t.Run("ReplicasAndTheWarehouseDatabaseAreLocalOnly", func(t *testing.T) {
		t.Parallel()
		b := setupCompose(t, nil)
		_, err := b.target.StartShop(ctx, ShopSpec{Name: "x", Replicas: map[Service]int{OrdersRelay: 2}})
		require.ErrorIs(t, err, ErrUnsupported)
		require.ErrorContains(t, err, "-target local")
		require.ErrorIs(t, b.target.Kill(ctx, WarehouseDB), ErrUnsupported)
	})

	t.Run("TheStandbyIsLocalOnly", func(t *testing.T) {
		t.Parallel()
		b := setupCompose(t, nil)
		require.ErrorIs(t, b.target.Kill(ctx, OrdersDBStandby), ErrUnsupported)
		require.ErrorIs(t, b.target.Restart(ctx, OrdersDBStandby), ErrUnsupported)
		require.ErrorIs(t, b.target.Promote(ctx, OrdersDB), ErrUnsupported)
	})

	t.Run("TheBrokerClusterIsLocalOnly", func(t *testing.T) {
		t.Parallel()
		b := setupCompose(t, nil)
		_, err := b.target.StartShop(ctx, ShopSpec{Name: "x", BrokerCluster: true})
		require.ErrorIs(t, err, ErrUnsupported)
		require.ErrorContains(t, err, "-target local")
		require.ErrorIs(t, b.target.KillBrokerNode(ctx, "rabbit@mq-0"), ErrUnsupported)
		require.ErrorIs(t, b.target.RestartBrokerNode(ctx, "rabbit@mq-0"), ErrUnsupported)
		_, err = b.target.BrokerClusterState(ctx)
		require.ErrorIs(t, err, ErrUnsupported)
	})

	t.Run("PauseStopStart", func(t *testing.T) {
		t.Parallel()
		b := setupCompose(t, nil)
		_, err := b.target.StartShop(ctx, ShopSpec{Name: "x"})
		require.NoError(t, err)
		b.docker.take()
		b.docker.mu.Lock()
		b.docker.answer = func(cmd string) (string, error) {
			if strings.Contains(cmd, " ps -a ") {
				return `{"Service":"orders-relay","State":"exited","ExitCode":0,"Status":"Exited (0)"}`, nil
			}
			return "", nil
		}
		b.docker.mu.Unlock()
		base := "docker compose -p chaos-test -f " + b.file + " -f " + b.override
		require.NoError(t, b.target.Pause(ctx, OrdersRelay))
		require.NoError(t, b.target.Resume(ctx, OrdersRelay))
		st, err := b.target.StopService(ctx, OrdersRelay, 10*time.Second)
		require.NoError(t, err)
		require.True(t, st.Clean(), "%+v", st)
		require.NoError(t, b.target.StartService(ctx, OrdersRelay))
		require.Equal(t, []string{
			base + " pause orders-relay", base + " unpause orders-relay",
			base + " stop -t 10 orders-relay", base + " ps -a --format json orders-relay",
			base + " up -d --wait --force-recreate --no-deps orders-relay",
		}, b.docker.take())

		b.docker.mu.Lock()
		b.docker.answer = func(string) (string, error) {
			return `{"Service":"warehouse","State":"exited","ExitCode":137,"Status":"Exited (137)"}`, nil
		}
		b.docker.mu.Unlock()
		st, err = b.target.StopService(ctx, Warehouse, time.Second)
		require.NoError(t, err)
		require.True(t, st.Killed, "137 is SIGKILL after the timeout")
		require.False(t, st.Clean())
	})

	t.Run("BrokerAlarm", func(t *testing.T) {
		t.Parallel()
		b := setupCompose(t, nil)
		b.docker.take()
		b.docker.mu.Lock()
		b.docker.answer = func(cmd string) (string, error) {
			switch {
			case strings.HasSuffix(cmd, "eval "+evalWatermark):
				return "0.4\n", nil
			case strings.HasSuffix(cmd, "eval "+evalAlarms):
				return "[{{resource_limit,memory,rabbit@x},[]}]\n", nil
			}
			return "", nil
		}
		b.docker.mu.Unlock()
		require.NoError(t, b.target.BrokerAlarm(ctx, true))
		alarms, err := b.target.BrokerAlarms(ctx)
		require.NoError(t, err)
		require.Equal(t, "[{{resource_limit,memory,rabbit@x},[]}]", alarms)
		require.NoError(t, b.target.BrokerAlarm(ctx, false))
		ctl := "docker compose -p chaos-test -f " + b.file + " -f " + b.override + " exec -T rabbitmq rabbitmqctl -q "
		require.Equal(t, []string{
			ctl + "eval " + evalWatermark,
			ctl + "set_vm_memory_high_watermark 0",
			ctl + "eval " + evalAlarms,
			ctl + "set_vm_memory_high_watermark 0.4",
		}, b.docker.take(), "the watermark is read once and set back")
	})

	t.Run("TheWALRelayScenarios", func(t *testing.T) {
		t.Parallel()
		// Those that need no second process of a service, no settings of one process and no
		// standby run on compose (its PostgreSQL is at wal_level = logical); the others say
		// so at the start.
		for name, runs := range map[string]bool{
			"wal-relay-kill": true, "slot-dropped": true, "wal-relay-catchup-kill": true,
			"wal-relay-standby": false, "relay-mode-switch": false, "pg-failover-wal": false,
			"broker-minority-partition": false, "pg-primary-isolated": false, "pg-primary-isolated-wal": false, "flaky-network": false,
		} {
			sc, ok := Lookup(name)
			require.True(t, ok, name)
			b := setupCompose(t, nil)
			_, err := b.target.StartShop(ctx, sc.shopSpec())
			if !runs {
				require.ErrorIs(t, err, ErrUnsupported, name)
				require.ErrorContains(t, err, "-target local", name)
				continue
			}
			require.NoError(t, err, name)
			override, err := os.ReadFile(b.override)
			require.NoError(t, err)
			require.Contains(t, string(override), `ORDERS_RELAY_MODE: "wal"`, name)
		}
	})

	t.Run("ComponentLogs", func(t *testing.T) {
		t.Parallel()
		b := setupCompose(t, nil)
		_, err := b.target.StartShop(ctx, ShopSpec{Name: "x"})
		require.NoError(t, err)
		b.docker.take()
		_, err = b.target.ComponentLogs(ctx, WarehouseDB)
		require.NoError(t, err)
		cmds := b.docker.take()
		require.Len(t, cmds, 1)
		require.Regexp(t, ` logs --no-color --no-log-prefix --since \d{4}-\d\d-\d\dT\S+ postgres$`, cmds[0])
		_, err = b.target.ComponentLogs(ctx, Component("redis"))
		require.ErrorIs(t, err, ErrUnsupported)
	})
}

func TestParsePS(t *testing.T) {
	t.Parallel()
	got, err := parsePS([]byte(" \n"))
	require.NoError(t, err)
	require.Empty(t, got)
	_, err = parsePS([]byte("{not json"))
	require.Error(t, err)
}

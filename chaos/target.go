package chaos

import (
	"context"
	"errors"
	"time"
)

// Service is one process of the shop, named as the services of docker-compose.yml.
type Service string

// The four processes of the shop, one per role.
const (
	// Warehouse is `warehouse api`: the stock API and the consumer of the orders' events.
	Warehouse Service = "warehouse"
	// WarehouseRelay is `warehouse relay`: the warehouse's outbox relay.
	WarehouseRelay Service = "warehouse-relay"
	// OrdersAPI is `orders api`: the orders API and the consumer of the stock events.
	OrdersAPI Service = "orders-api"
	// OrdersRelay is `orders relay`: the orders' outbox relay.
	OrdersRelay Service = "orders-relay"
)

// Services lists the processes in the order they start: each service declares the queue it
// consumes, so the consumers come up before the relays publish to them.
var Services = []Service{Warehouse, OrdersAPI, WarehouseRelay, OrdersRelay}

// consumers are the services that run an inbox consumer (and export inbox_duplicates_total).
var consumers = []Service{Warehouse, OrdersAPI}

// Component is a piece of infrastructure a scenario can kill and restart.
type Component string

// The components.
const (
	// Broker is the RabbitMQ node.
	Broker Component = "rabbitmq"
	// OrdersDB is the orders service's PostgreSQL (the local target runs one per service;
	// docker compose runs one for both).
	OrdersDB Component = "orders-db"
)

// ShopSpec is what a scenario asks of a fresh shop.
type ShopSpec struct {
	// Name identifies the scenario; targets derive database names from it.
	Name string
	// Failpoints arms crash points in a service's first incarnation: CHAOS_FAILPOINTS of that
	// process, e.g. "relay.after-publish=kill@40". A restarted process runs without them.
	Failpoints map[Service]string
}

// Endpoints is how the runner reaches a running shop.
type Endpoints struct {
	// OrdersURL and StockURL are the two HTTP APIs (http://127.0.0.1:port).
	OrdersURL, StockURL string
	// OrdersDB and WarehouseDB are PostgreSQL URLs of the two services' databases.
	OrdersDB, WarehouseDB string
	// AMQPURL reaches the broker directly, around any fault the target puts in the network:
	// the runner's observer queue and poison messages use it.
	AMQPURL string
	// Metrics is where each service serves /metrics.
	Metrics map[Service]string
}

// Death is a service process that ended without the runner asking.
type Death struct {
	Service Service
	// Incarnation counts the process's starts, from 1.
	Incarnation int
	At          time.Time
	// Killed reports death by SIGKILL: what a crash point does.
	Killed bool
	// Status is the exit status or signal as text ("signal: killed", "exit status 1").
	Status string
}

// NetworkStats says what a network fault did.
type NetworkStats struct {
	// Cut counts broker connections dropped by cuts; Refused, connections refused meanwhile.
	Cut, Refused int64
	// Delayed counts chunks of data held back by delays.
	Delayed int64
}

// ErrUnsupported is returned by a target for a fault it cannot inject.
var ErrUnsupported = errors.New("not supported by this target")

// Target runs the shop somewhere and breaks it on request. The runner calls Prepare once,
// then StartShop and StopShop around every scenario, and Close at the end (also after a
// failure or an interrupt).
type Target interface {
	// Name is the target's name ("local", "compose").
	Name() string
	// Prepare builds what the scenarios share (binaries, database servers, the broker).
	// progress receives a line per step.
	Prepare(ctx context.Context, progress func(string)) error
	// StartShop starts the four services on fresh databases and a broker without any of the
	// shop's queues, and returns once every one of them is ready.
	StartShop(ctx context.Context, spec ShopSpec) (Endpoints, error)
	// WaitDeath waits until svc ended without the runner asking (a crash point fired) and
	// says how. It returns ctx's error when that did not happen in time.
	WaitDeath(ctx context.Context, svc Service) (Death, error)
	// Heal brings svc back, without its crash points, if it is down, and waits until it is
	// ready again.
	Heal(ctx context.Context, svc Service) error
	// Deaths lists every death in the current shop so far.
	Deaths() []Death
	// Kill kills a component without warning (SIGKILL) and returns once it is gone.
	Kill(ctx context.Context, c Component) error
	// Restart starts a killed component again and returns once it answers.
	Restart(ctx context.Context, c Component) error
	// CutNetwork drops the services' broker connections and refuses new ones until
	// HealNetwork; DelayNetwork holds every chunk between them and the broker for d.
	CutNetwork(ctx context.Context) error
	DelayNetwork(ctx context.Context, d time.Duration) error
	HealNetwork(ctx context.Context) error
	// NetworkStats says what the network faults of the current shop did.
	NetworkStats() NetworkStats
	// Logs returns everything svc wrote in the current shop, all incarnations.
	Logs(ctx context.Context, svc Service) (string, error)
	// StopShop stops the services and deletes the shop's data.
	StopShop(ctx context.Context) error
	// Close stops and deletes everything the target started.
	Close() error
}

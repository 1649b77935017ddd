// Package rabbitmq publishes outbox messages to RabbitMQ with publisher confirms.
//
// [Publisher] implements outbox.Publisher. [New] takes a [Config]; the relay hands each batch
// to [Publisher.Publish], which sends it on one confirm-mode channel with every message in
// flight at once and reads each message's fate from its own confirm. Every failure is blamed
// on exactly one thing, the message, the broker, or neither: [Publisher.Publish] lists each
// outcome with the error it returns, and the properties each message carries.
//
// # Deadlines
//
// The deadline of the context given to Publish (the relay passes its PublishTimeout) bounds
// every step of the call, even a socket write to a broker that stopped reading:
// [Publisher.Publish] says how, and what running out of time costs.
//
// # Connections
//
// The publisher connects lazily and again after the connection closed: each Publish call first
// makes sure it has an open channel (an explicit supervisor; amqp091-go's own recovery is not
// used, so every reconnect is visible here and in [Hooks]). A channel the broker closed over
// one message is replaced by a new channel on the same connection: a message's fault never
// costs a reconnect.
//
// [Config].Connections lets the publisher serve several batches at once, each on an AMQP
// connection of its own, for a relay with several batches in flight
// (outbox.Config.InFlightBatches). [Config].URLs lists the nodes of a cluster, and says in
// which order they are tried.
//
// # Clusters
//
// A message confirmed by a quorum queue is on a majority of its replicas; a publisher whose
// node dies in the middle of a batch gets outbox.ErrUnavailable for the unconfirmed messages
// (never a false success), and the relay publishes them again through the next node. A quorum
// queue that lost its leader is led by another replica within a second or so; meanwhile the
// broker may nack ([ErrNacked]) or hold the confirms.
package rabbitmq

module github.com/outboxshop/outboxshop/tools

go 1.26.8

require (
	github.com/caarlos0/env/v11 v11.4.2
	github.com/stretchr/testify v1.12.1
	go.uber.org/goleak v1.3.0
)

require go.yaml.in/yaml/v3 v3.0.5 // indirect

module github.com/outboxshop/outboxshop/internal

go 1.26.8

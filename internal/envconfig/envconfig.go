// Package envconfig is the configuration style both services share: a flat struct whose
// fields carry their variable and its default in tags,
//
//	HTTPAddr string `env:"ORDERS_HTTP_ADDR" envDefault:":8080"`
//
// read once at start-up by [Load] (caarlos0/env), with the defaults alone from [Defaults] for
// tests and embedding, and checked by a Validate method written with [Checks], which reports
// every bad setting at once, by its variable's name.
//
// Settings both services have (the relay's, the consumer's) are declared once, in a struct
// whose fields carry the variable without the service's prefix, and embedded in each
// service's Config with the prefix as its env tag:
//
//	service.RelayEnv `env:"ORDERS_"` // ORDERS_RELAY_BATCH_SIZE, …
//
// The embedded fields are promoted, so cfg.RelayBatchSize reads as before; every variable a
// Config reads still starts with its service's prefix, and [Variables] lists them all.
//
// Any variable can also be given as a file, as the official images of PostgreSQL and RabbitMQ
// let their passwords be: ORDERS_DATABASE_URL_FILE=/run/secrets/orders-database-url sets
// ORDERS_DATABASE_URL to the file's content, trailing newlines trimmed, so that a URL with
// a password in it comes from a mounted Kubernetes Secret or a compose secret rather than
// from the process's environment, which `docker inspect`, /proc/<pid>/environ and crash
// reports show. Setting both is an error; so is a file that cannot be read or is empty. The
// errors name the variable and the path, never the content.
//
// Tags with envDefault were chosen over a DefaultConfig function that lists the values: the
// default stands next to its variable, where the README's table and a reviewer look for it,
// and the struct is the one place that names a setting.
package envconfig

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"reflect"
	"strings"

	"github.com/caarlos0/env/v11"
)

// Load returns a T with every field read from environ by its env tag, or set to its
// envDefault when the variable is unset or empty. A nil environ reads the process
// environment. A value that does not parse is an error naming the variable
// ("ORDERS_RELAY_POLL_INTERVAL: unable to parse duration: …").
func Load[T any](environ map[string]string) (T, error) {
	if environ == nil {
		environ = env.ToMap(os.Environ())
	}
	var cfg T
	environ, err := fromFiles(reflect.TypeFor[T](), environ)
	if err != nil {
		return cfg, fmt.Errorf("read configuration from the environment: %w", err)
	}
	// A struct field's env tag is the prefix of its fields' variables (see the package doc).
	if err := env.ParseWithOptions(&cfg, env.Options{Environment: environ, PrefixTagName: "env"}); err != nil {
		var zero T
		return zero, fmt.Errorf("read configuration from the environment: %w", nameVariables[T](err))
	}
	return cfg, nil
}

// LoadValid is [Load], then T's Validate: a configuration ready to run, or every problem
// with it.
func LoadValid[T interface{ Validate() error }](environ map[string]string) (T, error) {
	cfg, err := Load[T](environ)
	if err != nil {
		var zero T
		return zero, err
	}
	return cfg, cfg.Validate()
}

// Defaults returns a T with every envDefault and nothing from the environment. It panics
// when a default does not parse: they are constants, so that is a bug a test catches.
func Defaults[T any]() T {
	cfg, err := Load[T](map[string]string{})
	if err != nil {
		panic(fmt.Sprintf("envconfig: defaults of %T: %v", cfg, err))
	}
	return cfg
}

// nameVariables rewrites env's parse errors, which name the Go field, to name the
// environment variable instead.
func nameVariables[T any](err error) error {
	agg, ok := errors.AsType[env.AggregateError](err)
	if !ok {
		return err
	}
	names := variables(reflect.TypeFor[T](), "", map[string]string{})
	out := make([]error, 0, len(agg.Errors))
	for _, e := range agg.Errors {
		if pe, ok := errors.AsType[env.ParseError](e); ok {
			if name, ok := names[pe.Name]; ok {
				e = fmt.Errorf("%s: %w", name, pe.Err)
			}
		}
		out = append(out, e)
	}
	return errors.Join(out...)
}

// FileSuffix makes a variable's name the name of the variable that gives it as a file:
// ORDERS_DATABASE_URL_FILE=/run/secrets/orders-db-url sets ORDERS_DATABASE_URL to the
// content of that file ([Load]).
const FileSuffix = "_FILE"

// fromFiles returns environ with every variable of typ that is given as a file (its name and
// [FileSuffix], the convention of the official images: a mounted Kubernetes Secret, a compose
// secret) set to the file's content, trailing newlines trimmed ([SecretFromFile]). A
// variable set both ways, or a file that cannot be read or is empty, is an error naming the
// variable and the path, never the content. A variable whose _FILE name typ declares itself
// (a setting that reads its file on its own) is left alone.
func fromFiles(typ reflect.Type, environ map[string]string) (map[string]string, error) {
	names := VariablesOf(typ)
	declared := make(map[string]bool, len(names))
	for _, name := range names {
		declared[name] = true
	}
	out, cloned := environ, false
	var errs []error
	for _, name := range names {
		fileVar := name + FileSuffix
		path := environ[fileVar]
		if path == "" || declared[fileVar] {
			continue
		}
		value, err := SecretFromFile(Secret(environ[name]), name, path, fileVar)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !cloned { // the caller's map stays as it is
			out, cloned = maps.Clone(environ), true
		}
		out[name] = string(value)
	}
	return out, errors.Join(errs...)
}

// Variables returns the names of the environment variables T reads, in field order, those of
// an embedded or nested settings struct under its prefix ([Load]).
func Variables[T any]() []string { return VariablesOf(reflect.TypeFor[T]()) }

// VariablesOf is [Variables] of the struct type typ.
func VariablesOf(typ reflect.Type) []string {
	var out []string
	walk(typ, "", func(_ reflect.StructField, name string) { out = append(out, name) })
	return out
}

// variables maps the name of every field of typ that reads a variable to the variable's
// full name.
func variables(typ reflect.Type, prefix string, into map[string]string) map[string]string {
	walk(typ, prefix, func(f reflect.StructField, name string) { into[f.Name] = name })
	return into
}

// walk calls f with every field of typ that reads a variable, and the variable's name: a
// struct field's env tag prefixes the variables of its own fields.
func walk(typ reflect.Type, prefix string, f func(reflect.StructField, string)) {
	for field := range typ.Fields() {
		name, _, _ := strings.Cut(field.Tag.Get("env"), ",")
		switch {
		case name == "" || name == "-" || !field.IsExported():
		case field.Type.Kind() == reflect.Struct:
			walk(field.Type, prefix+name, f)
		default:
			f(field, prefix+name)
		}
	}
}

// Checks collects the broken rules of a configuration, so that Validate reports all of them
// at once. The zero value is ready to use.
type Checks struct{ errs []error }

// Check records the message when ok is false. The message names the variable:
// "ORDERS_RELAY_BATCH_SIZE must be positive, is 0".
func (c *Checks) Check(ok bool, format string, args ...any) {
	if !ok {
		c.errs = append(c.errs, fmt.Errorf(format, args...))
	}
}

// Add records err when it is not nil (the validation of a part, such as a topology).
func (c *Checks) Add(err error) {
	if err != nil {
		c.errs = append(c.errs, err)
	}
}

// Err joins the recorded messages, prefixed "invalid configuration", or returns nil.
func (c *Checks) Err() error {
	if err := errors.Join(c.errs...); err != nil {
		return fmt.Errorf("invalid configuration: %w", err)
	}
	return nil
}

// Section returns the settings of one part of a flat configuration as a T: each field F of
// T is the field prefix+F of cfg (a struct or a pointer to one), of the same type. It lets a
// service keep its flat, prefixed variables (ORDERS_RELAY_BATCH_SIZE in
// Config.RelayBatchSize) and hand a shared component its settings (a service.RelaySettings)
// without a mapping function in every service. A missing field or a type mismatch is a bug,
// and panics.
func Section[T any](cfg any, prefix string) T {
	src := reflect.Indirect(reflect.ValueOf(cfg))
	var out T
	dst := reflect.ValueOf(&out).Elem()
	for i := range dst.NumField() {
		name := prefix + dst.Type().Field(i).Name
		f := src.FieldByName(name)
		if !f.IsValid() || f.Type() != dst.Field(i).Type() {
			panic(fmt.Sprintf("envconfig: %s has no field %s of type %s", src.Type(), name, dst.Field(i).Type()))
		}
		dst.Field(i).Set(f)
	}
	return out
}

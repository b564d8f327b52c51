package registry

// OwnTransports returns cfg with an HTTP transport of its own for each
// connector, as before connectors of one origin shared them.
func OwnTransports(cfg Config) Config {
	cfg.ownTransports = true
	return cfg
}

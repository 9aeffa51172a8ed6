package stream

import "github.com/edgedio/edged/actors"

// WithCluster runs the job's tasks on the nodes of c, placed by
// c.Placement (which may be filled in after the environment is built).
func WithCluster(c *actors.Cluster) Option { return func(e *Environment) { e.cfg.Cluster = c } }

// JobOf returns the job graph the environment built.
func JobOf(e *Environment) (*actors.Job, error) {
	if err := e.resolve(); err != nil {
		return nil, err
	}
	return &e.job, nil
}

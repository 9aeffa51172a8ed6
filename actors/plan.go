package actors

import "fmt"

// Chain is a run of vertices executed in one task: each vertex after the
// first is fed by a forward edge from the one before, with equal
// parallelism, and neither end has other edges on that side.
type Chain struct {
	Vertices []*Vertex
	// In are the edges entering the chain's head.
	In []*Edge
	// Out are the edges leaving the chain's tail.
	Out []*Edge
}

// Head returns the first vertex of the chain.
func (c *Chain) Head() *Vertex { return c.Vertices[0] }

// Tail returns the last vertex of the chain.
func (c *Chain) Tail() *Vertex { return c.Vertices[len(c.Vertices)-1] }

// Name joins the names of the chained vertices with " -> ".
func (c *Chain) Name() string {
	s := c.Vertices[0].Name
	for _, v := range c.Vertices[1:] {
		s += " -> " + v.Name
	}
	return s
}

// Plan is the execution plan of a job: its chains in topological order
// (every chain after the chains that feed it).
type Plan struct {
	Chains []*Chain
}

// Tasks returns the number of tasks (subtasks of chains) the plan runs.
func (p *Plan) Tasks() int {
	n := 0
	for _, c := range p.Chains {
		n += c.Head().Parallelism
	}
	return n
}

// BuildPlan validates the job and groups its vertices into chains. It is a
// pure function of the graph.
func BuildPlan(j *Job) (*Plan, error) {
	if err := j.Validate(); err != nil {
		return nil, err
	}
	in := make(map[*Vertex][]*Edge)
	out := make(map[*Vertex][]*Edge)
	for _, e := range j.Edges {
		out[e.From] = append(out[e.From], e)
		in[e.To] = append(in[e.To], e)
	}
	chainable := func(e *Edge) bool {
		return e.Partition == Forward && e.Output == "" && e.Input == 0 && e.To.In2 == nil &&
			e.From.Parallelism == e.To.Parallelism &&
			len(out[e.From]) == 1 && len(in[e.To]) == 1 &&
			!e.From.NoChain && !e.To.NoChain
	}
	// A vertex heads a chain unless its single input edge is chainable.
	order := topoOrder(j, in)
	if len(order) < len(j.Vertices) {
		return nil, fmt.Errorf("%w: job %q has a cycle", ErrInvalidJob, j.Name)
	}
	var plan Plan
	chainOf := make(map[*Vertex]*Chain)
	for _, v := range order {
		if ie := in[v]; len(ie) == 1 && chainable(ie[0]) {
			c := chainOf[ie[0].From]
			c.Vertices = append(c.Vertices, v)
			c.Out = out[v]
			chainOf[v] = c
			continue
		}
		c := &Chain{Vertices: []*Vertex{v}, In: in[v], Out: out[v]}
		chainOf[v] = c
		plan.Chains = append(plan.Chains, c)
	}
	return &plan, nil
}

// topoOrder returns the vertices so that every vertex follows its inputs,
// ties broken by vertex id, so that the order is deterministic.
func topoOrder(j *Job, in map[*Vertex][]*Edge) []*Vertex {
	done := make(map[*Vertex]bool, len(j.Vertices))
	order := make([]*Vertex, 0, len(j.Vertices))
	for len(order) < len(j.Vertices) {
		progress := false
		for _, v := range j.Vertices {
			if done[v] {
				continue
			}
			ready := true
			for _, e := range in[v] {
				if !done[e.From] {
					ready = false
					break
				}
			}
			if ready {
				done[v] = true
				order = append(order, v)
				progress = true
			}
		}
		if !progress {
			break // a cycle; cannot be built through the stream API
		}
	}
	return order
}

"""Pure rules, no I/O: the lifecycle and its pointer plans (``lifecycle``), the canary
judgement (``canary``), fleet planning (``fleet``), who may do what (``access``) and adapter
names (``names``). Every function here is decided by its arguments alone."""

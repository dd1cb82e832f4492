"""Several ranks of one job: who this process is among them (``group``), the bounded
collectives feedrate's own coordination uses (``channel``), and each rank's share of the node
(``node``). Built on ``torch.distributed`` (gloo, beside whatever backend training uses)."""

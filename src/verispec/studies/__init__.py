"""The paper's studies, above the library: block-efficiency curves by estimation (``be_curves``), the power
analysis and the table of claims (``power``), and Figure 4 on real pairs (``figure4_real``)."""

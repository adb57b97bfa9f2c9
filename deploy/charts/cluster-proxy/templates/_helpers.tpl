{{- define "cluster-proxy.name" -}}cluster-proxy{{- end -}}
{{- define "cluster-proxy.labels" -}}
app.kubernetes.io/name: cluster-proxy
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}
{{- define "cluster-proxy.selector" -}}
app.kubernetes.io/name: cluster-proxy
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
{{- define "cluster-proxy.image" -}}{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}{{- end -}}
{{- define "cluster-proxy.signerSecret" -}}{{ .Values.pki.existingSignerSecret | default "cluster-proxy-signer" }}{{- end -}}
{{- define "cluster-proxy.serverSecret" -}}{{ .Values.pki.existingServerSecret | default "cluster-proxy-server" }}{{- end -}}
